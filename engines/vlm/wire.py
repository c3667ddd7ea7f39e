"""vLLM's OpenAI-compatible chat-completions format: request bodies out, errors and usage in.

Error texts follow vLLM's server (`{"error": {"message", "type", "param", "code"}}`; older builds
put the same keys at the top level): the context-length and image-limit messages carry the
server's numbers, which the caller needs to shrink its window or its image count.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

from engines.vlm.errors import VlmCacheMiss, VlmContextTooLong, VlmError, VlmRequestError, VlmTooManyImages
from engines.vlm.types import VlmImage, VlmMessage, VlmRequest, VlmText

# "This model's maximum context length is 32768 tokens. However, ..." (every vLLM version so far)
_CONTEXT_RE = re.compile(r"maximum context length is (\d+) tokens", re.IGNORECASE)
# "At most 8 image(s) may be provided in one prompt." (MultiModalDataParser)
_IMAGES_RE = re.compile(r"at most (\d+) image\(s\) may be provided", re.IGNORECASE)
# "Cache miss for image at index 0 but data is not provided." (a uuid-only image vLLM no longer holds)
_CACHE_MISS_RE = re.compile(r"cache miss for \w+ at index \d+", re.IGNORECASE)
_SCHEMA_NAME_RE = re.compile(r"[^A-Za-z0-9_-]")
MAX_ERROR_TEXT = 500  # of a server's message kept in an exception


# Fields vLLM takes that a server may refuse as unknown; the request still works without them
# (no usage in the stream, no tenant-scoped cache, first come first served).
OPTIONAL_FIELDS = ("cache_salt", "priority", "stream_options")


def chat_body(request: VlmRequest, model: str, *, image_uuids: bool,
              cached: Container[str] = (), omit: Container[str] = ()) -> dict[str, Any]:
    """The JSON body of one streamed chat completion for `request`. An image whose uuid is in
    `cached` (the server has it) goes by its uuid alone, without its bytes; the OPTIONAL_FIELDS in
    `omit` are left out."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [_message(m, request.cache_salt, image_uuids=image_uuids, cached=cached)
                     for m in request.messages],
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.priority:
        body["priority"] = request.priority  # only sent when set: a fcfs server refuses any non-zero value
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    if request.json_schema is not None:
        title = str(request.json_schema.get("title", "answer"))
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": _SCHEMA_NAME_RE.sub("_", title)[:64] or "answer", "schema": request.json_schema},
        }
    for name in OPTIONAL_FIELDS:
        if name in omit:
            body.pop(name, None)
    return body


def refused_field(message: str, body: Mapping[str, Any]) -> str | None:
    """The optional field a 4xx's message names, when the request carried it."""
    lowered = message.lower()
    return next((name for name in OPTIONAL_FIELDS if name in body and name in lowered), None)


def _message(message: VlmMessage, salt: str | None, *, image_uuids: bool, cached: Container[str]) -> dict[str, Any]:
    if message.role != "user" and all(isinstance(p, VlmText) for p in message.parts):
        # System and assistant turns as plain strings: the chat template renders them byte-exact.
        return {"role": message.role, "content": "".join(p.text for p in message.parts if isinstance(p, VlmText))}
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, VlmText):
            content.append({"type": "text", "text": part.text})
        else:
            content.append(_image_part(part, salt, image_uuids=image_uuids, cached=cached))
    return {"role": message.role, "content": content}


def image_uuid(image: VlmImage, salt: str | None) -> str:
    """vLLM keys its processor cache by this uuid instead of hashing the pixels again. Bound to the
    content (sha256) and scoped by the tenant's salt, so it can neither collide nor be guessed
    across tenants (the processor cache is not salted)."""
    return image.digest if salt is None else hashlib.sha256(f"{salt}\0{image.digest}".encode()).hexdigest()


def request_uuids(request: VlmRequest) -> list[str]:
    return [image_uuid(p, request.cache_salt) for m in request.messages for p in m.parts if isinstance(p, VlmImage)]


def _image_part(image: VlmImage, salt: str | None, *, image_uuids: bool, cached: Container[str]) -> dict[str, Any]:
    if not image_uuids:
        return {"type": "image_url", "image_url": {"url": image.data_url()}}
    uuid = image_uuid(image, salt)
    if uuid in cached:  # the server holds it: its uuid alone (vLLM: `image_url` null)
        return {"type": "image_url", "image_url": None, "uuid": uuid}
    return {"type": "image_url", "image_url": {"url": image.data_url()}, "uuid": uuid}


@dataclass(frozen=True, slots=True)
class ServerError:
    status: int
    message: str
    type: str = ""


def parse_error(status: int, payload: bytes | str | Mapping[str, Any]) -> ServerError:
    """The message of a vLLM/OpenAI error body, whichever shape it came in."""
    data: Any = payload
    if isinstance(payload, bytes | str):
        try:
            data = json.loads(payload)
        except ValueError:
            text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
            return ServerError(status, text.strip()[:MAX_ERROR_TEXT] or f"HTTP {status}")
    if isinstance(data, Mapping):
        inner = data.get("error", data)
        if isinstance(inner, Mapping):
            message = str(inner.get("message") or inner.get("detail") or f"HTTP {status}")
            code = inner.get("code")
            if status == 200 and isinstance(code, int):
                status = code  # an error event inside a 200 stream carries its status here
            return ServerError(status, message[:MAX_ERROR_TEXT], str(inner.get("type") or ""))
        if isinstance(inner, str):
            return ServerError(status, inner[:MAX_ERROR_TEXT])
    return ServerError(status, f"HTTP {status}")


def is_transient(status: int) -> bool:
    """Worth another try (later, or elsewhere): overload, rate limits and server faults."""
    return status in (408, 425, 429) or status >= 500


def client_error(error: ServerError) -> VlmError:
    """The typed exception for a refusal that retrying will not fix."""
    if (match := _CONTEXT_RE.search(error.message)) is not None:
        return VlmContextTooLong(f"vLLM: {error.message}", max_tokens=int(match.group(1)))
    if "context length" in error.message.lower():
        return VlmContextTooLong(f"vLLM: {error.message}")
    if (match := _IMAGES_RE.search(error.message)) is not None:
        return VlmTooManyImages(f"vLLM: {error.message}", limit=int(match.group(1)))
    if _CACHE_MISS_RE.search(error.message) is not None:
        return VlmCacheMiss(f"vLLM: {error.message}", status=error.status)
    hint = ""
    if error.status in (401, 403):
        hint = " (check the VLM API key)"
    elif error.status == 404:
        hint = " (check the VLM model name and the endpoint URL, which ends in /v1)"
    return VlmRequestError(f"the VLM server refused the request, HTTP {error.status}: {error.message}{hint}",
                           status=error.status)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None  # None: the server did not say


def parse_usage(usage: Any) -> Usage:
    if not isinstance(usage, Mapping):
        return Usage()
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        cached_tokens=_count(cached) if cached is not None else None,
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
