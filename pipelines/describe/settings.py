"""The describer's settings, and what every stream's describer shares (the VLM client)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engines.vlm.client import VlmClient
from pipelines.graph.engines import EngineKey

# The anchor of every request: byte-identical for every stream and every request, so vLLM keeps
# its blocks cached once for all of them. Nothing volatile (times, ids) may go in here.
SYSTEM_PROMPT = (
    "You watch a live camera for a video analytics service. You are shown frames in time order, each "
    "after a line [t=SECONDS] giving its time on the stream, with what was said near it as "
    '[t=SECONDS] speech: "..." and your earlier descriptions as your own turns. Describe only what '
    "the frames and speech show; say so when something is unclear rather than guessing. Answer with "
    "the JSON object you are asked for and nothing else."
)
# The volatile tail of a description request: short, so what is not cached is small.
DESCRIBE_INSTRUCTION = (
    "Describe the scene now, in at most two sentences, noting what changed since your last description. "
    'Answer as JSON: {"description": str, "people": int, "activity": str, "unusual": bool}.'
)
# The tail of an alert check; {question} is the rule's question.
CHECK_INSTRUCTION = (
    'Look at the newest frames and answer the question with JSON {{"answer": "yes" or "no", "reason": '
    '"at most ten words"}}. Question: {question}'
)

DESCRIPTION_SCHEMA = {
    "type": "object",
    "properties": {
        "description": {"type": "string"},
        "people": {"type": "integer", "minimum": 0},
        "activity": {"type": "string"},
        "unusual": {"type": "boolean"},
    },
    "required": ["description", "people", "activity", "unusual"],
    "additionalProperties": False,
}
CHECK_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "reason": {"type": "string"}},
    "required": ["answer", "reason"],
    "additionalProperties": False,
}


@dataclass(frozen=True, slots=True)
class DescribeSettings:
    frame_size: tuple[int, int] = (448, 252)  # every frame is letterboxed to this: 16x9 tiles of 28 px
    # Frames are sampled at most every min_interval_s while something happens (tracks come and
    # go, alerts, motion) and at least every max_interval_s when nothing does.
    min_interval_s: float = 1.0
    max_interval_s: float = 10.0
    motion_threshold: float = 6.0  # mean grey-level change (0-255) of a small thumbnail that counts as motion
    describe_interval_s: float = 3.0  # descriptions at most this often (and only with new frames)
    # An epoch ends (a new one starts, carrying the last description as its summary) at either budget.
    max_frames: int = 64
    max_prompt_tokens: int = 12_000
    max_tokens: int = 200  # of a description
    check_max_tokens: int = 40  # of an alert check's short JSON answer
    describe_priority: int = 10  # vLLM: lower is earlier; checks go ahead of descriptions
    check_priority: int = 0
    timeout_s: float = 30.0
    # Per tenant: streams of one tenant share the system prompt's blocks. Kept out of reprs.
    cache_salt: str | None = field(default=None, repr=False)
    system_prompt: str = SYSTEM_PROMPT
    instruction: str = DESCRIBE_INSTRUCTION
    check_instruction: str = CHECK_INSTRUCTION
    max_transcript_chars: int = 400  # of one caption segment written into the window

    def __post_init__(self) -> None:
        if not 0 < self.min_interval_s <= self.max_interval_s:
            raise ValueError("describe: need 0 < min_interval_s <= max_interval_s")
        if self.max_frames < 1 or self.max_prompt_tokens < 1:
            raise ValueError("describe: budgets must be positive")
        if "{question}" not in self.check_instruction:
            raise ValueError("describe: check_instruction must contain {question}")


@dataclass(frozen=True, slots=True)
class DescribeEngine:
    """What the describer of every stream shares: one VLM client (its endpoints, breakers,
    retry budget and in-flight bound are per service) and the settings."""

    client: VlmClient
    model: str
    settings: DescribeSettings = DescribeSettings()


DESCRIPTIONS: EngineKey[DescribeEngine] = EngineKey("descriptions")  # the engine in SharedEngines
