"""A vLLM stand-in for tests and benchmarks: a real aiohttp server on 127.0.0.1 speaking vLLM's
OpenAI-compatible API, with its automatic prefix caching simulated so `cached_tokens` means what
it means on a GPU.

    async with VllmSimulator(limit_images=8) as sim:
        settings = VlmSettings(endpoints=(sim.url,), model=sim.model)

What follows vLLM (v0.10+ OpenAI server):
- `GET /v1/models` (with `max_model_len`), `GET /health`, `GET /metrics` (prefix-cache counters);
- `POST /v1/chat/completions`, streamed (SSE `data:` lines, `data: [DONE]`, usage in a last chunk
  with `choices: []` when `stream_options.include_usage`) or not;
- errors as `{"error": {"message", "type", "param", "code"}}` with vLLM's texts: unknown model
  (404), `stream_options` without `stream`, a non-zero `priority` without priority scheduling,
  more images than `--limit-mm-per-prompt`, a prompt over the context length (both of vLLM's
  wordings), a uuid-only image the cache does not hold; `--api-key` refusals as `{"error": "Unauthorized"}`;
- `images="data"` is a server that takes images only as data URLs (vLLM before 0.11, SGLang,
  llama.cpp's server, Ollama, LM Studio): it ignores a part's `uuid` (its caches key images by
  their bytes) and refuses `"image_url": null` with a 400 in pydantic's words;
- `answers=` a server that does not constrain the answer to `response_format`'s schema (llama.cpp
  and Ollama builds without it, LM Studio with some models, a proxy that drops the field): its
  model writes the JSON in a ```json fence (`"fenced"`), inside a sentence (`"prose"`), or answers
  in plain words (`"text"`: a description's sentence, "Yes, <reason>." for a yes/no check);
- `refuse_fields=` a strict server (OpenAI's own API, proxies validating the request) that
  refuses fields it does not know with a 400: "Unrecognized request argument supplied: <field>";
- `usage.prompt_tokens_details.cached_tokens` only with `prompt_tokens_details=True`
  (`--enable-prompt-tokens-details`), and, as vLLM does, left out when it is 0.

The prompt is rendered with Qwen2.5-VL's chat template shape (`<|im_start|>role\\n ... <|im_end|>`,
a default system prompt when none is sent, images as `<|vision_start|>` + one placeholder per 28x28
tile + `<|vision_end|>`, the generation prompt last) and "tokenized" as 4 bytes of UTF-8 per token,
each text part on its own. Prefix caching as in vLLM's kv_cache_utils: 16-token blocks, each
block's hash chained to its parent's, the first block seeded with `cache_salt`, an image's tokens
keyed by its identity (the part's `uuid`, else a hash of its bytes) and offset; a hit is the
leading run of cached full blocks, at most prompt length - 1 (the last token is always computed);
then the blocks of prompt + answer enter a bounded LRU.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
DEFAULT_SYSTEM = "You are a helpful assistant."  # what Qwen2.5-VL's template adds when no system turn is sent
BLOCK = 16
BYTES_PER_TOKEN = 4
PATCH = 28  # Qwen2.5-VL: 14 px patches merged 2x2, one token per 28x28 px
MAX_BODY = 64 * 1024 * 1024
ANSWER_MODES = ("schema", "fenced", "prose", "text")

Token = bytes | tuple[Any, ...]


class VllmSimulator:
    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        max_model_len: int = 32768,
        limit_images: int = 8,
        latency_s: float = 0.0,
        per_token_s: float = 0.0,
        image_tokens: int | None = None,
        answer: Callable[[dict[str, Any]], str] | None = None,
        prompt_tokens_details: bool = True,
        scheduling_policy: str = "priority",
        min_pixels: int = 4 * PATCH * PATCH,
        max_pixels: int = 16384 * PATCH * PATCH,
        api_key: str | None = None,
        cache_blocks: int = 65536,
        max_requests_kept: int = 512,
        port: int = 0,
        images: str = "uuid",
        answers: str = "schema",
        refuse_fields: tuple[str, ...] = (),
    ) -> None:
        if images not in ("uuid", "data"):
            raise ValueError(f"images: 'uuid' or 'data', not {images!r}")
        if answers not in ANSWER_MODES:
            raise ValueError(f"answers: one of {ANSWER_MODES}, not {answers!r}")
        self.images = images
        self.answers = answers
        self.refuse_fields = refuse_fields
        self.model = model
        self.max_model_len = max_model_len
        self.limit_images = limit_images
        self.latency_s = latency_s  # before the first token (queue + prefill)
        self.per_token_s = per_token_s
        self.image_tokens = image_tokens  # None: from the image size, as Qwen2.5-VL's smart_resize does
        self.answer = answer
        self.prompt_tokens_details = prompt_tokens_details
        self.scheduling_policy = scheduling_policy
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.api_key = api_key
        # Knobs a test flips while the server runs.
        self.down = False  # answer every request with 503
        self.fail_next = 0  # answer the next N chat requests with 500
        self.malformed_next = 0  # the next N answers are broken JSON
        self.ignore_stream = False  # answer in one JSON body even when asked to stream (a buffering proxy)
        self.requests: list[dict[str, Any]] = []  # bodies received, newest last (bounded)
        self.in_flight = 0
        self.peak_in_flight = 0
        self.disconnects = 0  # streams the client closed before the end
        self.prefix_queries = 0  # tokens looked up in the prefix cache
        self.prefix_hits = 0
        self._max_requests = max_requests_kept
        self._cache: OrderedDict[bytes, None] = OrderedDict()
        self._cache_blocks = cache_blocks
        self._media: OrderedDict[str, int] = OrderedDict()  # processor cache: identity -> tokens
        self._port = port
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("VllmSimulator: not started")
        return self._port

    @property
    def open_connections(self) -> int:
        """Client connections open now (kept-alive ones included)."""
        server = self._runner.server if self._runner is not None else None
        return sum(c.transport is not None for c in server.connections) if server is not None else 0

    async def start(self) -> None:
        """Listen (again, on the same port after a stop: a restart of the server)."""
        if self._runner is None:
            app = web.Application(client_max_size=MAX_BODY, middlewares=[self._auth])
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/health", self._health)
            app.router.add_get("/metrics", self._metrics)
            app.router.add_post("/v1/chat/completions", self._chat)
            # A client that goes away cancels its request, as vLLM aborts a disconnected request.
            self._runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True, shutdown_timeout=0.5)
            await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", self._port, reuse_address=True)
        await self._site.start()
        if not self._port:
            server = self._site._server
            assert server is not None and hasattr(server, "sockets")
            self._port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Go down like a crashed server: open connections are cut and new ones refused until
        start() again. The prefix cache survives (a restart that keeps it is the kinder case)."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self._runner is not None and self._runner.server is not None:
            for connection in list(self._runner.server.connections):
                connection.force_close()

    async def close(self) -> None:
        await self.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> VllmSimulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def reset_cache(self) -> None:
        self._cache.clear()
        self._media.clear()

    # -- routes ------------------------------------------------------------------------------

    @web.middleware
    async def _auth(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        authorized = request.headers.get("Authorization") == f"Bearer {self.api_key}"
        if self.api_key and request.path.startswith("/v1") and not authorized:
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.down else 200)

    async def _models(self, request: web.Request) -> web.Response:
        if self.down:
            return _error(503, "The server is not ready.", "ServiceUnavailableError")
        card = {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": self.model, "parent": None, "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def _metrics(self, request: web.Request) -> web.Response:
        labels = f'{{model_name="{self.model}"}}'
        text = (f"vllm:prefix_cache_queries_total{labels} {self.prefix_queries}\n"
                f"vllm:prefix_cache_hits_total{labels} {self.prefix_hits}\n")
        return web.Response(text=text, content_type="text/plain")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "Request body is not valid JSON.", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "Request body must be a JSON object.", "BadRequestError")
        self.requests.append(body)
        del self.requests[: -self._max_requests]
        if self.down:
            return _error(503, "The server is not ready.", "ServiceUnavailableError")
        if self.fail_next > 0:
            self.fail_next -= 1
            return _error(500, "EngineCore encountered an issue. See stack trace for the root cause.",
                          "InternalServerError")
        refusal = self._validate(body)
        if refusal is not None:
            return refusal
        try:
            prompt = self._render(body)
        except _Refusal as exc:
            return _error(400, exc.message, "BadRequestError", exc.param)
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)
        if (refusal := self._check_length(len(prompt), max_tokens)) is not None:
            return refusal
        text = self._answer_text(body)
        if self.malformed_next > 0:
            self.malformed_next -= 1
            text = '{"description": "a person walks to the do'
        answer_tokens = _text_tokens(text)
        if max_tokens and len(answer_tokens) > max_tokens:  # cut like a real model at max_tokens
            text = "".join(t.decode("utf-8", "ignore") for t in answer_tokens[:max_tokens] if isinstance(t, bytes))
            answer_tokens, finish = answer_tokens[:max_tokens], "length"
        else:
            finish = "stop"
        cached = self._prefix_cache(prompt, answer_tokens, body.get("cache_salt"))
        usage = self._usage(len(prompt), cached, len(answer_tokens))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if body.get("stream") and not self.ignore_stream:
                return await self._stream(request, body, text, finish, usage=usage, n_tokens=len(answer_tokens))
            await asyncio.sleep(self.latency_s + self.per_token_s * len(answer_tokens))
            return web.json_response({
                "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": None, "finish_reason": finish, "stop_reason": None}],
                "usage": usage,
            })
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, body: dict[str, Any], text: str, finish: str, *,
                      usage: dict[str, Any], n_tokens: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        chunk_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

        try:
            await asyncio.sleep(self.latency_s)
            await _send(response, chunk({"role": "assistant", "content": ""}))
            pieces = _pieces(text, n_tokens)
            for piece in pieces:
                if self.per_token_s:
                    await asyncio.sleep(self.per_token_s)
                await _send(response, chunk({"content": piece}))
            await _send(response, chunk({}, finish))
            options = body.get("stream_options") or {}
            if options.get("include_usage"):
                await _send(response, {"id": chunk_id, "object": "chat.completion.chunk", "created": created,
                                       "model": self.model, "choices": [], "usage": usage})
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnects += 1
            raise
        return response

    # -- what vLLM checks --------------------------------------------------------------------

    def _validate(self, body: dict[str, Any]) -> web.Response | None:
        for name in self.refuse_fields:
            if name in body:
                return _error(400, f"Unrecognized request argument supplied: {name}", "invalid_request_error", name)
        if body.get("model") != self.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
        if body.get("stream_options") is not None and not body.get("stream"):
            return _error(400, "Stream options can only be defined when `stream=True`.", "BadRequestError")
        priority = body.get("priority", 0)
        if priority and self.scheduling_policy != "priority":
            return _error(400, f"Got priority {priority} but Priority scheduling is not enabled.", "BadRequestError")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "messages: Field required", "BadRequestError", "messages")
        return None

    def _check_length(self, prompt_tokens: int, max_tokens: int) -> web.Response | None:
        limit = self.max_model_len
        if prompt_tokens >= limit:
            return _error(400, f"This model's maximum context length is {limit} tokens. However, your request has "
                          f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
                          "BadRequestError")
        if max_tokens and prompt_tokens + max_tokens > limit:
            return _error(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                          f"maximum context length is {limit} tokens and your request has {prompt_tokens} input "
                          f"tokens ({max_tokens} > {limit} - {prompt_tokens}).", "BadRequestError")
        return None

    # -- the prompt as tokens ----------------------------------------------------------------

    def _render(self, body: dict[str, Any]) -> list[Token]:
        messages = body["messages"]
        images = [part for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
                  for part in m["content"] if isinstance(part, dict) and part.get("type") == "image_url"]
        if len(images) > self.limit_images:
            raise _Refusal(f"At most {self.limit_images} image(s) may be provided in one prompt. "
                           "Set `--limit-mm-per-prompt` to increase this limit.", "image")
        tokens: list[Token] = []
        if not (isinstance(messages[0], dict) and messages[0].get("role") == "system"):
            tokens += _turn("system", [_text_tokens(DEFAULT_SYSTEM)])
        image_index = 0
        for message in messages:
            if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant"):
                raise _Refusal("messages: each message needs a role of system, user or assistant", "messages")
            content = message.get("content")
            pieces: list[list[Token]] = []
            if isinstance(content, str):
                pieces.append(_text_tokens(content))
            elif isinstance(content, list):
                for part in content:
                    if not isinstance(part, dict):
                        raise _Refusal("messages: a content part is not an object", "messages")
                    if part.get("type") == "text":
                        pieces.append(_text_tokens(str(part.get("text", ""))))
                    elif part.get("type") == "image_url":
                        pieces.append(self._image_tokens(part, image_index))
                        image_index += 1
                    else:
                        raise _Refusal(f"Unknown part type: {part.get('type')}", "messages")
            tokens += _turn(message["role"], pieces)
        return tokens + [("special", "<|im_start|>"), *_text_tokens("assistant\n")]

    def _image_tokens(self, part: dict[str, Any], index: int) -> list[Token]:
        url = (part.get("image_url") or {}).get("url") if isinstance(part.get("image_url"), dict) else None
        given_uuid = part.get("uuid") if self.images == "uuid" else None
        if url is None and self.images == "data":
            raise _Refusal(f"1 validation error for ChatCompletionRequest\nmessages.{index}.content.image_url\n"
                           "  Input should be a valid dictionary [type=dict_type, input_value=None, "
                           "input_type=NoneType]", "messages")
        if url is None:
            if given_uuid is None or given_uuid not in self._media:
                raise _Refusal(f"Cache miss for image at index {index} but data is not provided.", "image")
            identity, count = str(given_uuid), self._media[given_uuid]
        else:
            data = _data_url_bytes(url)
            identity = str(given_uuid) if given_uuid is not None else hashlib.sha256(data).hexdigest()
            count = self.image_tokens if self.image_tokens is not None else self._tokens_for(data)
        self._media[identity] = count
        self._media.move_to_end(identity)
        while len(self._media) > self._cache_blocks:
            self._media.popitem(last=False)
        placeholders: list[Token] = [("image", identity, offset) for offset in range(count)]
        return [("special", "<|vision_start|>"), *placeholders, ("special", "<|vision_end|>")]

    def _tokens_for(self, jpeg: bytes) -> int:
        width, height = jpeg_size(jpeg)
        grid_h, grid_w = smart_resize(height, width, min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        return (grid_h // PATCH) * (grid_w // PATCH)

    # -- prefix cache ------------------------------------------------------------------------

    def _prefix_cache(self, prompt: list[Token], answer: list[Token], salt: Any) -> int:
        hashes = _block_hashes(prompt + answer, None if salt is None else str(salt))
        usable = (len(prompt) - 1) // BLOCK  # vLLM always computes the last prompt token
        hit = 0
        for block_hash in hashes[:usable]:
            if block_hash not in self._cache:
                break
            hit += 1
        self.prefix_queries += len(prompt)
        self.prefix_hits += hit * BLOCK
        for block_hash in hashes:
            self._cache[block_hash] = None
            self._cache.move_to_end(block_hash)
        while len(self._cache) > self._cache_blocks:
            self._cache.popitem(last=False)
        return hit * BLOCK

    def _usage(self, prompt_tokens: int, cached: int, completion_tokens: int) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                                 "completion_tokens": completion_tokens, "prompt_tokens_details": None}
        if self.prompt_tokens_details and cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _answer_text(self, body: dict[str, Any]) -> str:
        response_format = body.get("response_format") or {}
        asked_json = response_format.get("type") == "json_schema"
        if self.answer is not None:
            text = self.answer(body)
        elif asked_json:
            schema = (response_format.get("json_schema") or {}).get("schema") or {}
            text = json.dumps(sample_for_schema(schema))
        else:
            return "A person walks across an empty parking lot."
        return text if self.answers == "schema" or not asked_json else unconstrained(text, self.answers)


class _Refusal(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                             status=status)


async def _send(response: web.StreamResponse, payload: Mapping[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def _text_tokens(text: str) -> list[Token]:
    data = text.encode("utf-8")
    return [data[i : i + BYTES_PER_TOKEN] for i in range(0, len(data), BYTES_PER_TOKEN)]


def _turn(role: str, pieces: list[list[Token]]) -> list[Token]:
    tokens: list[Token] = [("special", "<|im_start|>"), *_text_tokens(f"{role}\n")]
    for piece in pieces:
        tokens += piece
    return [*tokens, ("special", "<|im_end|>"), *_text_tokens("\n")]


def _pieces(text: str, n_tokens: int) -> list[str]:
    """The answer in stream deltas of about one token each (never splitting a character)."""
    if not text:
        return []
    size = max(1, math.ceil(len(text) / max(1, n_tokens)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _block_hashes(tokens: list[Token], salt: str | None) -> list[bytes]:
    hashes: list[bytes] = []
    parent = b""
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        digest = hashlib.sha256(parent)
        digest.update(repr(tokens[start : start + BLOCK]).encode())
        if start == 0 and salt is not None:
            digest.update(b"\0salt\0" + salt.encode())
        parent = digest.digest()
        hashes.append(parent)
    return hashes


def _data_url_bytes(url: Any) -> bytes:
    if not isinstance(url, str) or not url.startswith("data:image/") or ";base64," not in url:
        raise _Refusal("Only base64 data URLs (data:image/...;base64,...) are accepted by this simulator.", "image")
    try:
        return base64.b64decode(url.split(",", 1)[1], validate=True)
    except (binascii.Error, ValueError):
        raise _Refusal("Failed to load image: invalid base64 data.", "image") from None


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a JPEG's start-of-frame marker."""
    if not data.startswith(b"\xff\xd8"):
        raise _Refusal("cannot identify image file", "image")
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            i += 1 if marker == 0xFF else 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height = int.from_bytes(data[i + 5 : i + 7], "big")
            width = int.from_bytes(data[i + 7 : i + 9], "big")
            return width, height
        i += 2 + length
    raise _Refusal("cannot identify image file", "image")


def smart_resize(height: int, width: int, *, min_pixels: int, max_pixels: int, factor: int = PATCH) -> tuple[int, int]:
    """Qwen2-VL's resize rule: both sides to multiples of 28 px, the area kept within the pixel limits."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def unconstrained(text: str, mode: str) -> str:
    """What a model told to answer in JSON, but not held to it, writes instead of `text`."""
    if mode == "fenced":
        return f"```json\n{text}\n```"
    if mode == "prose":
        return f"Sure! Here is the JSON you asked for: {text} Let me know if you need anything else."
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if not isinstance(value, dict):
        return text
    if isinstance(value.get("description"), str):
        return value["description"]
    if isinstance(value.get("answer"), str):
        reason = str(value.get("reason") or "").strip()
        return f"{value['answer'].capitalize()}{', ' + reason if reason else ''}."
    return "I checked the claims against the evidence and they look supported."


def sample_for_schema(schema: Mapping[str, Any]) -> Any:
    """A small value that fits a JSON schema: what a constrained model would produce."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        return {key: sample_for_schema(sub) for key, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind == "string":
        return "A person walks across an empty parking lot."
    if kind == "integer":
        return max(1, int(schema.get("minimum", 1)))
    if kind == "number":
        return float(schema.get("minimum", 0.5))
    if kind == "boolean":
        return False
    return None
