"""The capabilities' service plugins (realtime.service.plugin, realtime.service.plugins): one per
capability with service parts, each attaching with its capability off as the service always did;
the service wires what a plugin adds without naming a capability."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import io
import tokenize
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import generate_latest

from pipelines.batching import BatcherStats
from pipelines.capabilities import CAPABILITIES
from pipelines.capability import Sample
from pipelines.describe.settings import DESCRIPTIONS
from pipelines.events import Event
from realtime.bus.publisher import NatsEventPublisher
from realtime.config import Config
from realtime.http.search import TimelineApi
from realtime.service import service as service_module
from realtime.service.engine_metrics import SampleCollector
from realtime.service.plugin import Attached, PluginContext, ServicePlugin
from realtime.service.plugins import SERVICE_PLUGINS, descriptions
from realtime.service.service import Service
from realtime.streams.descriptions import LatestDescriptions
from realtime.streams.transcripts import TranscriptStore
from realtime.timeline.ask import Asker
from realtime.timeline.timeline import Timeline
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
SERVICE_SOURCE = ROOT / "realtime" / "service" / "service.py"
PLUGINS_DIR = ROOT / "realtime" / "service" / "plugins"
# What a plugin imports that is not its capability's own: the contract (its panels' too) and shared machinery.
SHARED = {"realtime.http", "realtime.http.page", "realtime.service.plugin", "realtime.service.engine_metrics",
          "realtime.bus.snapshots", "realtime.config", "realtime.streams.registry"}  # the last two: the context's types


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a name inside a module, not a module
        return False


def imported(path: Path) -> set[str]:
    """Every module `path` imports (`from realtime.http import clips` imports `realtime.http.clips`)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules |= {node.module} | {m for a in node.names if is_module(m := f"{node.module}.{a.name}")}
    return modules


def capability_packages() -> set[str]:
    packages = {f"pipelines.{p.parent.name}" for p in (ROOT / "pipelines").glob("*/capability.py")}
    assert len(packages) == len(CAPABILITIES)  # one package declaring each capability
    return packages


def stub_service(opened: dict[str, object] | None = None, *, timeline: Any = None) -> Service:
    """A Service built, not run: a detector that is never called, a publisher never connected."""
    batcher = SimpleNamespace(detector=SimpleNamespace(info=SimpleNamespace(names={0: "person"})), compute=None,
                              stats=BatcherStats(), alive=True, oldest_call_s=lambda: 0.0)
    publisher = NatsEventPublisher("nats://127.0.0.1:1", node="test")
    return Service(Config.model_validate({"node": "test"}), cast(Any, batcher), publisher, opened=opened,
                   timeline=timeline)


def context_from(service: Service, timeline: Any = None) -> PluginContext:
    return PluginContext(config=service.config, engines=service.engines, registry=service.registry,
                         publisher=service.publisher, fleet=None, http=service.context,
                         timeline_api=TimelineApi(timeline, None))


def test_every_plugin_names_one_capability_in_the_capabilities_order() -> None:
    names = [c.name for c in CAPABILITIES]
    plugged = [p.capability for p in SERVICE_PLUGINS]
    assert len(set(plugged)) == len(plugged)
    # Those of no capability (fed by events all the same) come before the capabilities' own.
    own = [name for name in plugged if name in names]
    assert plugged[len(plugged) - len(own):] == own and set(plugged[:len(plugged) - len(own)]) == {"homeassistant"}
    assert own == sorted(own, key=names.index)  # their taps see an event in this order
    assert {"captions", "descriptions", "clips"} <= set(plugged)


def test_the_service_names_no_capability() -> None:
    plugin_imports = set().union(*(imported(p) for p in PLUGINS_DIR.glob("*.py") if p.name != "__init__.py"))
    own = {m for m in plugin_imports - SHARED if m.startswith("realtime.")}
    assert {"realtime.http.transcript", "realtime.streams.descriptions", "realtime.fleet.clips",
            "realtime.timeline.ask"} <= own
    service_imports = imported(SERVICE_SOURCE)
    assert not service_imports & own
    assert not [m for m in service_imports if m.startswith(tuple(f"{p}." for p in capability_packages()))]
    words = {c.name for c in CAPABILITIES} | {c.section for c in CAPABILITIES} \
        | {k.value for c in CAPABILITIES for k in c.kinds}
    code = SERVICE_SOURCE.read_text()
    names = {t.string.lower() for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.NAME}
    assert not sorted((n, w) for n in names for w in words if w in n)


def test_with_every_capability_off_the_service_keeps_each_plugins_routes() -> None:
    service = stub_service()
    paths = {r.resource.canonical for r in service.app.router.routes() if r.resource is not None}
    assert {
        "/api/streams/{stream_id}/captions.vtt",
        "/api/streams/{stream_id}/description",
        "/api/clips",
        "/api/clips/{name}",
        "/api/streams/{stream_id}/clips",
        "/api/search",
        "/api/ask",
    } <= paths
    assert "descriptions" not in service.context.capabilities_on
    assert isinstance(service.plugin("captions").state, TranscriptStore)
    assert isinstance(service.plugin("descriptions").state, LatestDescriptions)
    clips = service.plugin("clips")  # outside a fleet: the API alone
    assert (clips.state, clips.taps, clips.tasks, clips.collectors) == (None, (), (), ())
    with pytest.raises(KeyError):
        service.plugin("segmentation")  # no service parts


def test_a_vlm_allows_vlm_rules_and_with_the_timeline_answers_questions() -> None:
    describer = SimpleNamespace(client=object(), model="m")
    service = stub_service({DESCRIPTIONS.name: describer})
    assert "descriptions" in service.context.capabilities_on
    no_index = context_from(service)
    descriptions.PLUGIN.attach(no_index)
    assert no_index.timeline_api.asker is None  # asking needs the index too
    with_index = context_from(service, timeline=cast(Timeline, SimpleNamespace(retrieve=lambda *_: [])))
    descriptions.PLUGIN.attach(with_index)
    assert isinstance(with_index.timeline_api.asker, Asker)
    assert with_index.timeline_api.asker.timeout_s == service.config.http.request_timeout_s - 5.0

    off = stub_service()
    with_index = context_from(off, timeline=cast(Timeline, SimpleNamespace(retrieve=lambda *_: [])))
    descriptions.PLUGIN.attach(with_index)
    assert ("descriptions" in off.context.capabilities_on, with_index.timeline_api.asker) == (False, None)


class Recorder:
    """A plugin that adds one of everything and notes what the service does with it."""

    def __init__(self, capability: str, seen: list[tuple[str, str]]) -> None:
        self.capability = capability
        self.seen = seen
        self.running = asyncio.Event()
        self.cancelled = False

    def plugin(self) -> ServicePlugin:
        return ServicePlugin(self.capability, self.attach)

    def attach(self, _ctx: PluginContext) -> Attached:
        async def run() -> None:
            self.running.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise

        async def probe(_request: web.Request) -> web.Response:
            return web.Response(text=self.capability)

        return Attached(
            taps=(lambda event: self.seen.append(("tap", self.capability)),),
            routes=lambda app: app.router.add_get(f"/probe-{self.capability}", probe) and None,
            collectors=(SampleCollector(lambda: [Sample(f"vidsentry_probe_{self.capability}", "a probe", 1.0)]),),
            tasks=((f"probe-{self.capability}", run),),
            forget=(lambda stream_id: self.seen.append((f"forget {stream_id}", self.capability)),),
            state=self,
        )


async def test_the_service_wires_what_each_plugin_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    first, second = Recorder("first", seen), Recorder("second", seen)
    monkeypatch.setattr(service_module, "SERVICE_PLUGINS", (first.plugin(), second.plugin()))
    service = stub_service()
    assert service.plugin("second").state is second

    async def published(_event: Event) -> None:
        return None

    monkeypatch.setattr(service.publisher, "publish", published)
    await service.fanout.publish(cast(Event, SimpleNamespace(stream_id="cam", durable=False, body=None)))
    service._stream_gone("cam")  # the registry's on_gone hook: neither desired nor running any more
    assert seen == [("tap", "first"), ("tap", "second"), ("forget cam", "first"), ("forget cam", "second")]
    metrics = generate_latest(service.metrics.registry).decode()
    assert "vidsentry_probe_first_total 1.0" in metrics and "vidsentry_probe_second_total 1.0" in metrics

    stop, listening = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(service.run("127.0.0.1", 0, stop, on_listening=lambda _: listening.set()))
    try:
        await wait_until(lambda: listening.is_set() or task.done(), 10, "the service to listen")
        await asyncio.wait_for(asyncio.gather(first.running.wait(), second.running.wait()), 5)
        async with aiohttp.ClientSession() as session, session.get(f"{service.url}/probe-second") as response:
            assert (response.status, await response.text()) == (200, "second")
        assert not first.cancelled
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert first.cancelled and second.cancelled  # the service's tasks end with it
