"""One streamed chat completion over aiohttp: the HTTP exchange and nothing else (no retries,
no routing). Failures come out as the typed errors, or as `TransientFailure` for the caller's
retry and circuit-breaker logic."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from engines.errors import EngineError
from engines.vlm.errors import VlmBadResponse
from engines.vlm.sse import DONE, SseParser
from engines.vlm.types import DeltaSink
from engines.vlm.wire import Usage, client_error, is_transient, parse_error, parse_usage

MAX_ANSWER_CHARS = 1 << 20  # a runaway stream is cut here; max_tokens keeps real answers far below
MAX_ERROR_BODY = 64 * 1024


class TransientFailure(EngineError):
    """Worth another try later or elsewhere: 5xx/429, a refused or dropped connection, a cut stream."""

    def __init__(self, reason: str, *, status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    finish_reason: str | None
    usage: Usage
    model: str


def new_session(*, connect_timeout_s: float, max_connections: int, api_key: str | None) -> aiohttp.ClientSession:
    headers = {"Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max_connections, enable_cleanup_closed=True),
        # The whole-call deadline is the caller's asyncio timeout; here only the connect phase.
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s),
        headers=headers,
        raise_for_status=False,
    )


async def stream_chat(
    session: aiohttp.ClientSession, endpoint: str, payload: bytes, on_delta: DeltaSink | None = None
) -> Completion:
    """POST one chat-completions body (JSON, already encoded) and read the streamed answer."""
    url = endpoint.rstrip("/") + "/chat/completions"
    try:
        async with session.post(url, data=payload, headers={"Content-Type": "application/json"}) as response:
            try:
                if response.status != 200:
                    raw = await response.content.read(MAX_ERROR_BODY)
                    error = parse_error(response.status, raw)
                    if is_transient(error.status):
                        raise TransientFailure(f"HTTP {error.status}: {error.message}", status=error.status)
                    raise client_error(error)
                if response.content_type == "application/json":
                    whole = await _read_whole(response)  # a proxy or server that would not stream
                    if on_delta is not None and whole.text:
                        on_delta(whole.text)
                    return whole
                return await _read_stream(response, on_delta)
            except BaseException:
                response.close()  # cancelled or failed mid-stream: drop the connection, never reuse it
                raise
    except aiohttp.ClientResponseError as exc:
        raise TransientFailure(f"{type(exc).__name__}: {exc.message}", status=exc.status) from exc
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        raise TransientFailure(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc


async def _read_stream(response: aiohttp.ClientResponse, on_delta: DeltaSink | None = None) -> Completion:
    parser = SseParser()
    pieces: list[str] = []
    size = 0
    finish_reason: str | None = None
    usage = Usage()
    model = ""
    done = False
    try:
        async for line in response.content:
            data = parser.feed(line)
            if data is None:
                continue
            if data == DONE:
                done = True
                break
            chunk = _json(data)
            if "error" in chunk:  # vLLM reports a failure after the 200 as one last event
                error = parse_error(200, chunk)
                if is_transient(error.status):
                    raise TransientFailure(f"error in stream: {error.message}", status=error.status)
                raise client_error(error)
            model = str(chunk.get("model") or model)
            if chunk.get("usage") is not None:
                usage = parse_usage(chunk["usage"])
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict):
                    raise VlmBadResponse("stream chunk: a choice is not an object")
                delta = choice.get("delta") or {}
                content = delta.get("content") if isinstance(delta, dict) else None
                if isinstance(content, str) and content:
                    size += len(content)
                    if size > MAX_ANSWER_CHARS:
                        raise VlmBadResponse(f"answer longer than {MAX_ANSWER_CHARS} characters")
                    pieces.append(content)
                    if on_delta is not None:
                        on_delta(content)
                if choice.get("finish_reason"):
                    finish_reason = str(choice["finish_reason"])
    except UnicodeDecodeError as exc:
        raise VlmBadResponse("stream is not UTF-8") from exc
    except ValueError as exc:  # an over-long line or event
        raise VlmBadResponse(f"malformed stream: {exc}") from exc
    if not done:
        raise TransientFailure("stream ended before [DONE]")
    return Completion("".join(pieces), finish_reason, usage, model)


async def _read_whole(response: aiohttp.ClientResponse) -> Completion:
    raw = await response.content.read(MAX_ANSWER_CHARS * 4 + 1)
    if len(raw) > MAX_ANSWER_CHARS * 4:
        raise VlmBadResponse(f"answer larger than {MAX_ANSWER_CHARS * 4} bytes")
    try:
        body = _json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise VlmBadResponse("answer is not UTF-8") from exc
    if "error" in body:
        error = parse_error(200, body)
        if is_transient(error.status):
            raise TransientFailure(f"error in answer: {error.message}", status=error.status)
        raise client_error(error)
    choices = body.get("choices")
    choice: Any = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise VlmBadResponse("answer has no choices[0].message")
    content = message.get("content")
    return Completion(content if isinstance(content, str) else "", choice.get("finish_reason"),
                      parse_usage(body.get("usage")), str(body.get("model") or ""))


def _json(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise VlmBadResponse(f"stream event is not JSON: {data[:80]!r}") from exc
    if not isinstance(chunk, dict):
        raise VlmBadResponse("stream event is not a JSON object")
    return chunk
