"""Request builders shared by the VLM tests: the describer's layout in miniature."""

from __future__ import annotations

from engines.vlm.types import VlmImage, VlmMessage, VlmRequest, VlmText

SYSTEM = (
    "You watch a live camera. Frames come in time order, each after a line [t=SECONDS]. Describe only "
    "what the frames show and answer with the JSON object you are asked for."
)
SCHEMA = {
    "type": "object",
    "properties": {"description": {"type": "string"}, "people": {"type": "integer", "minimum": 0}},
    "required": ["description", "people"],
    "additionalProperties": False,
}


def append_only(frames: list[VlmImage], n: int, *, salt: str | None = None, key: str = "cam-1",
                **options: object) -> VlmRequest:
    """System prompt, epoch header, then [t=..] + frame pairs in capture order, the instruction last."""
    parts: list[VlmText | VlmImage] = [VlmText("Camera: gate. Epoch 1 started at 12:00:00Z.")]
    for i in range(n):
        parts += [VlmText(f"[t={2 * i}.0s]"), frames[i]]
    parts.append(VlmText(f"Describe the scene as of t={2 * n}.0s."))
    messages = (VlmMessage("system", (VlmText(SYSTEM),)), VlmMessage("user", tuple(parts)))
    return VlmRequest(messages, route_key=key, json_schema=SCHEMA, cache_salt=salt, max_tokens=64,
                      **options)  # type: ignore[arg-type]


def sliding(frames: list[VlmImage], first: int, n: int, *, key: str = "cam-1") -> VlmRequest:
    """The naive layout: the newest n frames first, then the instruction (a window that slides)."""
    parts: list[VlmText | VlmImage] = [frames[i] for i in range(first, first + n)]
    parts.append(VlmText(f"Describe the scene as of t={2 * (first + n)}.0s."))
    messages = (VlmMessage("system", (VlmText(SYSTEM),)), VlmMessage("user", tuple(parts)))
    return VlmRequest(messages, route_key=key, json_schema=SCHEMA, max_tokens=64)


def question(text: str = "Is anyone there?", *, key: str = "cam-1", **options: object) -> VlmRequest:
    messages = (VlmMessage("system", (VlmText(SYSTEM),)), VlmMessage("user", (VlmText(text),)))
    return VlmRequest(messages, route_key=key, max_tokens=32, **options)  # type: ignore[arg-type]
