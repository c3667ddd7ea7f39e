"""What can go wrong talking to vLLM, as types a caller can act on."""

from __future__ import annotations

from engines.errors import EngineError


class VlmError(EngineError):
    """Base class of every VLM client failure."""


class VlmUnavailable(VlmError):
    """No endpoint can answer now: circuits open, every endpoint down, retries or time spent.
    Try again after `retry_after_s`."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class VlmTimeout(VlmUnavailable):
    """The request's `timeout_s` ran out before an answer came."""


class VlmContextTooLong(VlmError):
    """vLLM refused the prompt: prompt plus max_tokens exceed the model's context.
    `max_tokens` is the server's context length when its message gave it."""

    def __init__(self, message: str, *, max_tokens: int | None = None) -> None:
        super().__init__(message)
        self.max_tokens = max_tokens


class VlmTooManyImages(VlmError):
    """More images than the server's --limit-mm-per-prompt allows; `limit` is that number."""

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class VlmBadResponse(VlmError):
    """The stream was malformed, or the model's JSON does not parse or fit the schema."""

    def __init__(self, message: str, *, text: str = "") -> None:
        super().__init__(message)
        self.text = text  # what the model said, for a log line (bounded by max_tokens)


class VlmRequestError(VlmError):
    """Any other refusal (4xx): our bug or the configuration (unknown model, bad API key). Not retried."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class VlmCacheMiss(VlmRequestError):
    """An image sent by its uuid alone was not in vLLM's multimodal cache ("Cache miss for image at
    index i but data is not provided."): send it again with its data."""
