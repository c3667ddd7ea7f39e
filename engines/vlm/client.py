"""The VLM client: routes each stream to its vLLM endpoint, retries within a budget, opens a
circuit on a failing endpoint, and turns vLLM's answers and refusals into typed results."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engines.errors import EngineError
from engines.vlm.answers import FORMS, read_fields
from engines.vlm.errors import (
    VlmCacheMiss,
    VlmError,
    VlmRequestError,
    VlmTimeout,
    VlmTooManyImages,
    VlmUnavailable,
)
from engines.vlm.resilience import BreakerState, CircuitBreaker, RetryBudget, backoff_s
from engines.vlm.routing import rendezvous_order
from engines.vlm.types import DeltaSink, VlmRequest, VlmResponse
from engines.vlm.wire import chat_body, refused_field, request_uuids

if TYPE_CHECKING:
    import aiohttp

    from engines.vlm.transport import Completion

log = logging.getLogger(__name__)

MAX_MISSES_IN_A_ROW = 3  # an endpoint whose cache never holds an image (caching off) gets the data
# How a server refuses the shape of a request (images by uuid, a field it does not know): pydantic's
# refusal of `"image_url": null` (vLLM before 0.11, SGLang, LM Studio) is a 400, FastAPI's own a
# 422; llama.cpp, Ollama and OpenAI's API answer 400.
SHAPE_REFUSAL_STATUSES = (400, 422)
REFUSAL_LOGGED = 160  # characters of a refusal kept for a log line


@dataclass(frozen=True, slots=True)
class VlmSettings:
    endpoints: tuple[str, ...]  # base URLs, e.g. "http://vllm:8000/v1"
    model: str
    api_key: str | None = field(default=None, repr=False)  # from the environment; never logged
    connect_timeout_s: float = 5.0
    max_retries: int = 2  # per request, on 5xx/timeouts/connection errors
    retry_budget_ratio: float = 0.2  # retries at most this fraction of requests (token bucket)
    breaker_failures: int = 5  # consecutive failures that open an endpoint's circuit
    breaker_reset_s: float = 15.0  # open -> half-open probe after this
    max_in_flight: int = 16  # per client, across streams
    image_uuids: bool = True  # send each image's content-bound uuid so vLLM skips re-hashing its pixels
    # An image sent (with data) to an endpoint in one of its last this many images goes by uuid alone
    # next time; a cache miss sends it again with its data. 0: always send the data.
    uuid_only_images: int = 1024
    # An endpoint that refused images by uuid gets plain data URLs; asked again with uuids after this
    # long (the server may have been upgraded), and after a restart of the client.
    uuid_reprobe_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("vlm: at least one endpoint")
        for url in self.endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"vlm: endpoint {url!r} must be an http(s):// base URL such as http://vllm:8000/v1")
            if "@" in url.split("//", 1)[1].split("/", 1)[0]:
                raise ValueError("vlm: put credentials in the API key, not in the endpoint URL")
        if len(set(self.endpoints)) != len(self.endpoints):
            raise ValueError("vlm: an endpoint is listed twice")
        if not self.model:
            raise ValueError("vlm: model is required")
        if self.max_retries < 0 or self.max_in_flight < 1 or self.connect_timeout_s <= 0:
            raise ValueError("vlm: max_retries >= 0, max_in_flight >= 1, connect_timeout_s > 0")
        if self.uuid_reprobe_s <= 0:
            raise ValueError("vlm: uuid_reprobe_s > 0")


@dataclass(frozen=True, slots=True)
class EndpointStats:
    url: str
    breaker: str  # closed | open | half_open
    requests: int
    failures: int
    times_opened: int
    image_limit: int | None
    images: str = "uuid"  # how it gets images: "uuid" (content-bound ids, data once) or "data" (data URLs only)
    omitted: tuple[str, ...] = ()  # optional fields it refused, left out of its requests


@dataclass(frozen=True, slots=True)
class VlmStats:
    requests: int  # complete() calls
    succeeded: int
    failed: int
    retries: int
    retries_denied: int  # a retry the budget did not allow
    timeouts: int
    in_flight: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    endpoints: tuple[EndpointStats, ...]
    request_bytes: int = 0  # request bodies sent (JSON), retries included
    images_sent: int = 0  # images sent with their data
    images_by_uuid: int = 0  # images sent by uuid alone (the server had them)
    cache_misses: int = 0  # uuid-only requests the server no longer had the images for (sent again)
    uuid_refusals: int = 0  # requests refused for their image uuids, sent again at once with data URLs
    # How answers to requests with a JSON schema came: whole JSON, JSON inside a fence or prose, or
    # no JSON at all (a server that ignores response_format).
    answers_json: int = 0
    answers_extracted: int = 0
    answers_text: int = 0
    fields_refused: int = 0  # requests refused for an optional field (cache_salt, priority, stream_options)


class _Endpoint:
    def __init__(self, url: str, settings: VlmSettings, clock: Callable[[], float]) -> None:
        self.url = url
        self.breaker = CircuitBreaker(settings.breaker_failures, settings.breaker_reset_s, clock)
        self.image_limit: int | None = None  # learned from a too-many-images refusal
        self.reports_cached = False  # vLLM omits cached_tokens when 0: once seen, absence means 0
        self.sent: OrderedDict[str, None] = OrderedDict()  # image uuids this endpoint has (LRU, bounded)
        self.misses_in_a_row = 0  # uuid-only images it no longer had; past MAX_MISSES_IN_A_ROW, data always
        self.data_only_until = 0.0  # monotonic time: until then it refused images by uuid; data URLs only
        self.data_only_unconfirmed = False  # set by a refusal, cleared by the data-only answer that follows
        self.data_only_logged = False
        self.last_refusal = ""
        self.omit: set[str] = set()  # optional fields it refused as unknown: left out from then on
        self.requests = 0
        self.failures = 0


class VlmClient:
    def __init__(self, settings: VlmSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` times the circuit breakers (a test drives its own)."""
        from engines.vlm import transport  # aiohttp only once a client exists

        self._settings = settings
        self._transport = transport
        self._endpoints = {url: _Endpoint(url, settings, clock) for url in settings.endpoints}
        self._budget = RetryBudget(settings.retry_budget_ratio)
        self._slots = asyncio.Semaphore(settings.max_in_flight)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._counts = dict.fromkeys(
            ("requests", "succeeded", "failed", "retries", "retries_denied", "timeouts", "in_flight",
             "prompt_tokens", "cached_tokens", "completion_tokens", "request_bytes", "images_sent",
             "images_by_uuid", "cache_misses", "uuid_refusals", "fields_refused",
             *(f"answers_{form}" for form in FORMS)), 0)

    async def complete(self, request: VlmRequest, *, on_delta: DeltaSink | None = None) -> VlmResponse:
        """One chat completion. Raises VlmUnavailable (fast while every circuit is open),
        VlmTimeout after request.timeout_s, VlmContextTooLong, VlmTooManyImages, VlmBadResponse,
        VlmRequestError. Cancelling it aborts the HTTP request.

        `on_delta` sees the answer as it streams in: each piece of text, and None when an attempt
        failed part-way and a retry starts over (what it saw so far is void)."""
        if self._closed:
            raise VlmUnavailable("VLM client is closed", retry_after_s=float("inf"))
        self._counts["requests"] += 1
        self._budget.on_request()
        started = time.monotonic()
        deadline = asyncio.get_running_loop().time() + request.timeout_s
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    await self._slots.acquire()
            except TimeoutError:
                raise VlmTimeout(f"no free VLM slot within {request.timeout_s:g} s "
                                 f"({self._settings.max_in_flight} requests in flight)") from None
            self._counts["in_flight"] += 1
            try:
                response = await self._with_retries(request, started, deadline, on_delta)
            finally:
                self._counts["in_flight"] -= 1
                self._slots.release()
        except VlmError as exc:
            self._counts["failed"] += 1
            self._counts["timeouts"] += isinstance(exc, VlmTimeout)
            raise
        self._counts["succeeded"] += 1
        self._counts["prompt_tokens"] += response.prompt_tokens
        self._counts["cached_tokens"] += response.cached_tokens or 0
        self._counts["completion_tokens"] += response.completion_tokens
        return response

    async def _with_retries(
        self, request: VlmRequest, started: float, deadline: float, on_delta: DeltaSink | None
    ) -> VlmResponse:
        attempt = 0
        while True:
            endpoint = self._pick(request.route_key)
            limit = endpoint.image_limit
            if limit is not None and request.image_count() > limit:
                endpoint.breaker.release()  # no request went out: a half-open probe slot stays free
                raise VlmTooManyImages(
                    f"{request.image_count()} images, but {endpoint.url} takes at most {limit} per prompt", limit=limit)
            try:
                completion = await self._attempt(endpoint, request, deadline, on_delta)
            except self._transport.TransientFailure as exc:
                attempt += 1
                if on_delta is not None:
                    on_delta(None)
                log.debug("VLM %s failed (%s), attempt %d", endpoint.url, exc, attempt)
                if attempt > self._settings.max_retries:
                    raise VlmUnavailable(f"VLM request failed {attempt} times; last: {exc}",
                                         retry_after_s=self._retry_after()) from None
                if not self._budget.try_spend():
                    self._counts["retries_denied"] += 1
                    raise VlmUnavailable(f"VLM failing ({exc}); retry budget spent",
                                         retry_after_s=self._retry_after()) from None
                pause = backoff_s(attempt)
                if asyncio.get_running_loop().time() + pause >= deadline:
                    raise VlmTimeout(f"VLM failing ({exc}); no time left for a retry within {request.timeout_s:g} s",
                                     retry_after_s=self._retry_after()) from None
                self._counts["retries"] += 1
                await asyncio.sleep(pause)
                continue
            except VlmTooManyImages as exc:
                endpoint.image_limit = exc.limit  # remembered: image_limit() tells the describer
                raise
            except _FieldRefused as exc:
                self._counts["fields_refused"] += 1
                endpoint.omit.add(exc.field)
                log.warning("VLM endpoint %s refused the field %r (%s): sending requests without it",
                            endpoint.url, exc.field, _one_line(exc.error))
                if on_delta is not None:
                    on_delta(None)
                continue
            except _UuidsRefused as exc:
                # Not the server's fault nor a transient one: it takes images as data URLs only.
                # Sent again at once without uuids; no retry is spent.
                self._counts["uuid_refusals"] += 1
                self._refused_uuids(endpoint, exc.error)
                if on_delta is not None:
                    on_delta(None)
                continue
            except VlmCacheMiss:
                # The server lost images it had (a restart, its cache full): send them with their
                # data, at once; that is not a failure of the endpoint, and no retry is spent.
                self._counts["cache_misses"] += 1
                endpoint.sent.clear()
                endpoint.misses_in_a_row += 1
                if endpoint.misses_in_a_row == MAX_MISSES_IN_A_ROW:
                    log.warning("VLM endpoint %s never keeps images sent by uuid (its multimodal caches are off?): "
                                "sending their data every time", endpoint.url)
                if on_delta is not None:
                    on_delta(None)
                continue
            return self._response(endpoint, request, completion, started)

    def _pick(self, route_key: str) -> _Endpoint:
        """The stream's home endpoint, or the next one in its rendezvous order while home's
        circuit is open. Raises VlmUnavailable when every circuit is open."""
        for url in rendezvous_order(route_key, self._settings.endpoints):
            endpoint = self._endpoints[url]
            if endpoint.breaker.acquire():
                return endpoint
        raise VlmUnavailable("every VLM endpoint is failing (circuits open)", retry_after_s=self._retry_after())

    def _retry_after(self) -> float:
        waits = [e.breaker.retry_after_s() for e in self._endpoints.values()]
        return max(0.5, min(waits))

    async def _attempt(
        self, endpoint: _Endpoint, request: VlmRequest, deadline: float, on_delta: DeltaSink | None
    ) -> Completion:
        endpoint.requests += 1
        send_uuids = self._settings.image_uuids and time.monotonic() >= endpoint.data_only_until
        uuid_only = (send_uuids and self._settings.uuid_only_images > 0
                     and endpoint.misses_in_a_row < MAX_MISSES_IN_A_ROW)
        body = chat_body(request, self._settings.model, image_uuids=send_uuids,
                         cached=endpoint.sent if uuid_only else (), omit=endpoint.omit)
        # Encoded once, here: what is counted is what goes on the wire (frames as base64 are MBs).
        payload = json.dumps(body, separators=(",", ":")).encode()
        by_uuid = self._count_body(body, len(payload))
        breaker = endpoint.breaker
        try:
            async with asyncio.timeout_at(deadline):
                completion = await self._transport.stream_chat(self._get_session(), endpoint.url, payload, on_delta)
        except TimeoutError:
            self._failed(endpoint, "no answer in time")  # a hung server is as down as a refusing one
            raise VlmTimeout(f"no answer from {endpoint.url} within {request.timeout_s:g} s",
                             retry_after_s=self._retry_after()) from None
        except self._transport.TransientFailure as exc:
            self._failed(endpoint, str(exc))
            raise
        except VlmError as exc:
            self._answered(endpoint)  # with a refusal, but it answered: the endpoint is up
            if type(exc) is VlmRequestError and exc.status in SHAPE_REFUSAL_STATUSES:
                if (field := refused_field(str(exc), body)) is not None:
                    raise _FieldRefused(field, exc) from None
                if send_uuids and request.image_count():
                    raise _UuidsRefused(exc) from None
            if endpoint.data_only_unconfirmed and isinstance(exc, VlmRequestError):
                # The same refusal without uuids: it was about something else. Undo the verdict.
                endpoint.data_only_until, endpoint.data_only_unconfirmed = 0.0, False
            raise
        except BaseException:
            breaker.release()  # cancelled: no verdict on the endpoint
            raise
        self._answered(endpoint)
        if endpoint.data_only_unconfirmed and not send_uuids:
            endpoint.data_only_unconfirmed = False
            if not endpoint.data_only_logged:
                endpoint.data_only_logged = True
                log.warning("VLM endpoint %s does not take images by uuid (it refused them: %s): sending them as "
                            "data URLs, trying uuids again every %.0f s", endpoint.url,
                            endpoint.last_refusal, self._settings.uuid_reprobe_s)
        if uuid_only:
            self._remember(endpoint, request, held=by_uuid > 0)
        return completion

    def _refused_uuids(self, endpoint: _Endpoint, error: VlmRequestError) -> None:
        """The endpoint refused a request that named images by uuid: data URLs only for a while.
        Unconfirmed until the same request goes through without uuids."""
        endpoint.data_only_until = time.monotonic() + self._settings.uuid_reprobe_s
        endpoint.data_only_unconfirmed = True
        endpoint.last_refusal = _one_line(error)
        endpoint.sent.clear()

    def _count_body(self, body: dict[str, Any], size: int) -> int:
        """Bytes on the wire and how each image went (with its data, or by uuid alone); returns
        how many went by uuid alone."""
        self._counts["request_bytes"] += size
        by_uuid = 0
        for message in body["messages"]:
            for part in message["content"] if isinstance(message["content"], list) else ():
                if part.get("type") == "image_url":
                    by_uuid += part["image_url"] is None
                    self._counts["images_by_uuid" if part["image_url"] is None else "images_sent"] += 1
        return by_uuid

    def _remember(self, endpoint: _Endpoint, request: VlmRequest, *, held: bool) -> None:
        """The request's images are in the endpoint's cache now (until it evicts them); `held`: some
        went by uuid alone and the server had them, so its cache works."""
        uuids = request_uuids(request)
        if held:
            endpoint.misses_in_a_row = 0
        for uuid in uuids:
            endpoint.sent[uuid] = None
            endpoint.sent.move_to_end(uuid)
        while len(endpoint.sent) > self._settings.uuid_only_images:
            endpoint.sent.popitem(last=False)

    def _failed(self, endpoint: _Endpoint, reason: str) -> None:
        endpoint.failures += 1
        opened = endpoint.breaker.times_opened
        endpoint.breaker.record_failure()
        if endpoint.breaker.times_opened != opened:  # one line per outage, not one per request
            log.warning("VLM endpoint %s is failing (%s): its streams go elsewhere or wait %.0f s",
                        endpoint.url, reason, endpoint.breaker.retry_after_s())

    def _answered(self, endpoint: _Endpoint) -> None:
        if endpoint.breaker.times_opened and endpoint.breaker.state is not BreakerState.CLOSED:
            log.warning("VLM endpoint %s answers again", endpoint.url)
        endpoint.breaker.record_success()

    def _response(
        self, endpoint: _Endpoint, request: VlmRequest, completion: Completion, started: float
    ) -> VlmResponse:
        usage = completion.usage
        if usage.cached_tokens is not None:
            endpoint.reports_cached = True
        cached = usage.cached_tokens if usage.cached_tokens is not None else (0 if endpoint.reports_cached else None)
        fields, form = None, None
        if request.json_schema is not None:
            read = read_fields(completion.text, request.json_schema, cut=completion.finish_reason == "length",
                               max_tokens=request.max_tokens)
            fields, form = read.values, read.form
            self._counts[f"answers_{form}"] += 1
        return VlmResponse(
            text=completion.text,
            fields=fields,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=cached,
            completion_tokens=usage.completion_tokens,
            latency_ms=(time.monotonic() - started) * 1000.0,
            model=completion.model or self._settings.model,
            endpoint=endpoint.url,
            form=form,
        )

    def image_limit(self, route_key: str) -> int | None:
        """The image limit learned from a too-many-images refusal by this stream's endpoint."""
        for url in rendezvous_order(route_key, self._settings.endpoints):
            endpoint = self._endpoints[url]
            if endpoint.breaker.state is not BreakerState.OPEN:
                return endpoint.image_limit
        return self._endpoints[rendezvous_order(route_key, self._settings.endpoints)[0]].image_limit

    def stats(self) -> VlmStats:
        c = self._counts
        return VlmStats(
            requests=c["requests"], succeeded=c["succeeded"], failed=c["failed"], retries=c["retries"],
            retries_denied=c["retries_denied"], timeouts=c["timeouts"], in_flight=c["in_flight"],
            prompt_tokens=c["prompt_tokens"], cached_tokens=c["cached_tokens"],
            completion_tokens=c["completion_tokens"], request_bytes=c["request_bytes"],
            images_sent=c["images_sent"], images_by_uuid=c["images_by_uuid"], cache_misses=c["cache_misses"],
            uuid_refusals=c["uuid_refusals"], answers_json=c["answers_json"],
            answers_extracted=c["answers_extracted"], answers_text=c["answers_text"],
            fields_refused=c["fields_refused"],
            endpoints=tuple(
                EndpointStats(e.url, e.breaker.state.value, e.requests, e.failures, e.breaker.times_opened,
                              e.image_limit, "data" if time.monotonic() < e.data_only_until else "uuid",
                              tuple(sorted(e.omit)))
                for e in self._endpoints.values()
            ),
        )

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            s = self._settings
            self._session = self._transport.new_session(
                connect_timeout_s=s.connect_timeout_s, max_connections=s.max_in_flight, api_key=s.api_key)
        return self._session


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:REFUSAL_LOGGED]


class _FieldRefused(EngineError):
    """A 4xx naming an optional field the request carried: the server does not know it."""

    def __init__(self, field: str, error: VlmRequestError) -> None:
        super().__init__(str(error))
        self.field, self.error = field, error


class _UuidsRefused(EngineError):
    """A 4xx to a request that named its images by uuid: the server may take data URLs only."""

    def __init__(self, error: VlmRequestError) -> None:
        super().__init__(str(error))
        self.error = error


def create_vlm_client(settings: VlmSettings) -> VlmClient:
    return VlmClient(settings)
