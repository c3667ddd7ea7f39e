"""Server-sent events as vLLM streams them: `data: <json>` lines, a blank line after each event,
`data: [DONE]` at the end. Comments (`:`) and other fields are skipped."""

from __future__ import annotations

DONE = "[DONE]"


class SseParser:
    """Feed it lines (bytes, with or without their newline); it returns each event's data when the
    event ends. Data lines of one event are joined with newlines, as the SSE spec says."""

    def __init__(self, max_event_bytes: int = 1 << 20) -> None:
        self._data: list[str] = []
        self._size = 0
        self._max = max_event_bytes

    def feed(self, line: bytes) -> str | None:
        text = line.decode("utf-8").rstrip("\r\n")
        if not text:
            return self._flush()
        if text.startswith(":"):
            return None
        name, _, value = text.partition(":")
        if name != "data":
            return None  # event:, id:, retry: carry nothing vLLM uses
        value = value.removeprefix(" ")
        self._size += len(value)
        if self._size > self._max:
            raise ValueError(f"server-sent event larger than {self._max} bytes")
        self._data.append(value)
        return None

    def close(self) -> str | None:
        """The last event when the stream ended without its blank line."""
        return self._flush()

    def _flush(self) -> str | None:
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data.clear()
        self._size = 0
        return data
