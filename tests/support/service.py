"""An in-process `serve`: the real Service on a free loopback port, with a real nats-server,
the real (small) nudenet detector, and an aiohttp client pointed at it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engines.asr.types import SpeechRecognizer
from engines.asr.vad import VadModel
from engines.detector import Detector
from engines.registry import create_detector
from pipelines.captions.capability import serve_captions
from pipelines.captions.engine import CAPTIONS
from pipelines.describe.settings import DESCRIPTIONS, DescribeEngine
from pipelines.detect import DetectionBatcher
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from realtime.cli.bootstrap import compute_budget
from realtime.config import Config
from realtime.service.service import Service
from realtime.timeline.timeline import open_timeline
from tests.support.waiting import wait_until

CaptionModels = tuple[SpeechRecognizer, VadModel]  # the session-wide `caption_models` fixture

# Cameras in tests come and go within seconds.
FAST_SUPERVISOR = {
    "backoff_initial_s": 0.2,
    "backoff_max_s": 1.0,
    "watchdog_s": 1.5,
    "stall_restart_s": 4.0,
    "open_timeout_s": 3.0,
}




@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any  # parsed JSON, or text when not JSON

    @property
    def is_json(self) -> bool:
        return self.headers.get("Content-Type", "").startswith("application/json")


@dataclass
class LiveService:
    service: Service
    url: str
    session: aiohttp.ClientSession
    token: str | None = None

    async def call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        data: bytes | str | None = None,
        token: str | None = "default",
        content_type: str | None = "application/json",  # sent with a body, as an API client does
    ) -> Reply:
        headers = {}
        use = self.token if token == "default" else token
        if use is not None:
            headers["Authorization"] = f"Bearer {use}"
        if json_body is not None:
            data = json.dumps(json_body)
        if data is not None and content_type is not None:
            headers["Content-Type"] = content_type
        async with self.session.request(method, self.url + path, data=data, headers=headers) as response:
            text = await response.text()
            try:
                body: Any = json.loads(text) if text else None
            except ValueError:
                body = text
            return Reply(response.status, dict(response.headers), body)

    async def stream(self, stream_id: str) -> dict[str, Any]:
        reply = await self.call("GET", f"/api/streams/{stream_id}")
        assert reply.status == 200, reply
        body: dict[str, Any] = reply.body
        return body

    async def wait_for_state(self, stream_id: str, state: str, within_s: float = 20, min_processed: int = 0) -> None:
        deadline = time.monotonic() + within_s
        while True:
            body = await self.stream(stream_id)
            if body["state"] == state and body["counters"]["frames_processed"] >= min_processed:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{stream_id} never reached {state}: {body}")
            await asyncio.sleep(0.02)


# Tests add loopback cameras and local clips over the API: open the source policy (see test_source_policy.py).
OPEN_SOURCES = {"allow_private_hosts": True, "allow_local_hosts": True, "local_dirs": ["/"]}


def make_config(**overrides: Any) -> Config:
    raw: dict[str, Any] = {
        "node": "test",
        "supervisor": FAST_SUPERVISOR,
        "http": {"sse_heartbeat_s": 1.0},
        "sources": OPEN_SOURCES,
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return Config.model_validate(raw)


@contextlib.asynccontextmanager
async def live_service(
    detector: Detector,
    nats_url: str,
    *,
    config: Config | None = None,
    token: str | None = None,
    captions: CaptionModels | None = None,
    more_models: Mapping[str, SpeechRecognizer] | None = None,
    describe: DescribeEngine | None = None,
    compute: bool = False,
    opened: dict[str, object] | None = None,
    timeline: bool = False,
) -> AsyncIterator[LiveService]:
    """The service; with `captions` (the session's recognizer and VAD) streams with audio get captions,
    and streams may name the models of `more_models` (the session's others, by name) for their own;
    with `describe` (a VLM client) every stream gets scene descriptions, with `compute` the models share
    the cores through the compute budget as `serve` builds it (config.compute); `opened` adds other
    capabilities' engines by name; with `timeline` the search index runs (config.timeline)."""
    config = config or make_config()
    budget = None
    if compute:
        budget = compute_budget(config, detector, off=[] if captions is not None else [CAPTIONS.name])
    async with contextlib.AsyncExitStack() as stack:
        publisher = await stack.enter_async_context(NatsEventPublisher(nats_url, node="test"))
        batcher = await stack.enter_async_context(DetectionBatcher(detector, compute=budget))
        engine = None
        if captions is not None:  # the session's models, served as open_captions serves its own
            engine = await stack.enter_async_context(
                serve_captions(*captions, config.captions, budget, lent=more_models))
        engines = {**(opened or {}), CAPTIONS.name: engine, DESCRIPTIONS.name: describe}
        index = None
        if timeline:
            index = await stack.enter_async_context(
                open_timeline(config.timeline, lambda: publisher.nc, node=config.node))
        service = Service(config, batcher, publisher, api_token=token,
                          opened={name: e for name, e in engines.items() if e is not None}, timeline=index)
        stop = asyncio.Event()
        listening = asyncio.Event()
        task = asyncio.create_task(service.run("127.0.0.1", 0, stop, on_listening=lambda _: listening.set()))
        try:
            await wait_until(lambda: listening.is_set() or task.done(), 10, "the service to listen")
            if task.done():
                task.result()
            assert service.url is not None
            async with aiohttp.ClientSession() as session:
                yield LiveService(service, service.url, session, token)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


@pytest.fixture(scope="module")
def detector(nudenet_model: Path) -> Iterator[Detector]:
    # The 320n model on one thread: cheap enough that stream churn, not inference, dominates.
    det = create_detector(nudenet_model, "onnx-cpu", threads=1)
    yield det
    det.close()


@pytest.fixture
async def svc(detector: Detector, shared_nats_server: EmbeddedNatsServer) -> AsyncIterator[LiveService]:
    async with live_service(detector, shared_nats_server.url) as live:
        yield live
