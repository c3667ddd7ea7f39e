"""What a VLM request is made of, and what comes back. Plain frozen dataclasses."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class VlmImage:
    """One frame, JPEG-encoded once at the configured fixed size and reused by every request that
    shows it: identical bytes are what lets vLLM's prefix cache recognise the image again."""

    jpeg: bytes
    width: int
    height: int
    digest: str = ""  # sha256 hex of `jpeg`; filled in when left empty
    _data_url: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.jpeg.startswith(b"\xff\xd8"):
            raise ValueError("VlmImage: not JPEG data")
        if self.width <= 0 or self.height <= 0:
            raise ValueError("VlmImage: width and height must be positive")
        if not self.digest:
            object.__setattr__(self, "digest", hashlib.sha256(self.jpeg).hexdigest())
        # Encoded here, once: a frame in a window of 24 is sent in up to 24 requests.
        object.__setattr__(self, "_data_url", "data:image/jpeg;base64," + base64.b64encode(self.jpeg).decode("ascii"))

    def data_url(self) -> str:
        return self._data_url


@dataclass(frozen=True, slots=True)
class VlmText:
    text: str


VlmPart = VlmText | VlmImage


@dataclass(frozen=True, slots=True)
class VlmMessage:
    role: Literal["system", "user", "assistant"]
    parts: tuple[VlmPart, ...]


@dataclass(frozen=True, slots=True)
class VlmRequest:
    messages: tuple[VlmMessage, ...]
    route_key: str  # the stream id: picks the endpoint (rendezvous hashing), so its prefix stays cached there
    max_tokens: int = 256
    json_schema: Mapping[str, Any] | None = None  # -> response_format {"type": "json_schema", ...}
    priority: int = 0  # vLLM: lower value = scheduled earlier (needs --scheduling-policy priority)
    cache_salt: str | None = None  # per tenant; only requests with the same salt share cached blocks
    timeout_s: float = 30.0  # for the whole call, retries included

    def __post_init__(self) -> None:
        if not self.messages:
            raise ValueError("VlmRequest: no messages")
        if self.max_tokens < 1:
            raise ValueError("VlmRequest: max_tokens must be at least 1")
        if not self.timeout_s > 0:
            raise ValueError("VlmRequest: timeout_s must be positive")

    def image_count(self) -> int:
        return sum(isinstance(part, VlmImage) for message in self.messages for part in message.parts)


@dataclass(frozen=True, slots=True)
class VlmResponse:
    text: str  # the assistant message content (streamed and joined)
    fields: Mapping[str, Any] | None  # parsed JSON when json_schema was given and the answer held it
    prompt_tokens: int
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens when the server reports it
    completion_tokens: int
    latency_ms: float
    model: str
    endpoint: str  # base URL used (never credentials)
    # With a json_schema: "json", "extracted" (from a fence or prose) or "text" (no JSON; fields None).
    form: str | None = None


DeltaSink = Callable[[str | None], None]  # a streamed piece of the answer; None: a retry starts over
