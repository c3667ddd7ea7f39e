"""A capability is its own package and one registry line. The chimes of `tests/support/chimes`
(a kind, a rule type with its check, a config section and a per-stream switch, a service plugin
with a route) are installed for these tests only, by `pipelines.capabilities.installed` in place
of a line in `BUILT_IN`, and no project file names them: in the real service, with a real
nats-server and the real detector, their events reach NATS (JetStream: the kind is durable) and an
SSE viewer (and a browser session's DataChannel), their rule alerts, their route answers and the
timeline finds them. Their card on the page is shown in Chromium by
tests/realtime/http/static/test_panels.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from engines.detector import Detector
from engines.registry import create_detector
from pipelines.capabilities import CAPABILITIES, installed
from pipelines.events import KINDS, Event, EventKind
from pipelines.graph.engines import EngineKey
from pipelines.rules.specs import CORE_RULES, rule_list
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import durable_subjects
from realtime.config import Config, config_model
from realtime.config_checks import config_rule_problems
from realtime.service.plugins import SERVICE_PLUGINS
from realtime.timeline.entries import indexed_kinds
from realtime.webrtc.channel import EventChannel
from tests.realtime.webrtc.test_channel import FakeDataChannel, offer_all, settle
from tests.support.chimes.body import ChimeBody
from tests.support.chimes.capability import CAPABILITY as CHIMES
from tests.support.chimes.rule import ChimeRule
from tests.support.service import FAST_SUPERVISOR, OPEN_SOURCES, live_service
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def chimes() -> Iterator[type[Config]]:
    """The config model with chimes in it, while they are installed."""
    with installed(CHIMES):
        yield config_model(CAPABILITIES)


@pytest.fixture(scope="module")
def detector(nudenet_model: Path) -> Iterator[Detector]:
    det = create_detector(nudenet_model, "onnx-cpu", threads=1)
    yield det
    det.close()


def stream(vtest_avi: Path, stream_id: str, **extra: Any) -> dict[str, Any]:
    return {"id": stream_id, "url": str(vtest_avi), "audio": False, "detect_fps": 2, **extra}


def test_installed_for_a_while_the_capability_is_in_every_list_and_then_in_none(chimes: type[Config]) -> None:
    chime = EventKind("chimes")
    assert EventKind.CHIMES is chime and KINDS[chime].durable and chime in list(EventKind)
    assert "vidsentry.*.chimes" in durable_subjects() and chime in indexed_kinds()
    assert [p.capability for p in SERVICE_PLUGINS][-1] == "chimes"
    config = chimes.model_validate(
        {
            "chimes": {"every_frames": 2},
            "streams": [
                {
                    "id": "cam",
                    "url": "rtsp://cam/1",
                    "chimes": False,
                    "rules": [{"id": "b", "type": "chime", "sound": "x"}],
                }
            ],
        }
    )
    assert config.section("chimes").every_frames == 2 and "chimes" in config.streams[0].stages_off()
    assert config_rule_problems(config) is None
    off = chimes.model_validate({"chimes": {"enabled": False}, "streams": config.model_dump()["streams"]})
    assert (
        config_rule_problems(off) == "streams.0.rules.0.type: rule 'b': a chime rule needs chimes: set chimes.enabled"
    )
    with pytest.raises(ValueError, match="'chime' is not a rule type"):
        Config.model_validate(
            {"streams": [{"id": "cam", "url": "rtsp://cam/1", "rules": [{"id": "b", "type": "chime", "sound": "x"}]}]}
        )


async def test_a_browser_sessions_datachannel_carries_chimes(chimes: type[Config]) -> None:
    channel, dc = EventChannel(max_buffered_bytes=1 << 20), FakeDataChannel()
    channel.attach(dc)
    runner = asyncio.create_task(channel.run())
    try:
        dc.open()
        await offer_all(channel, [Event("s1", 1.5, 0.0, ChimeBody("bell", 3))])
        await settle()
    finally:
        runner.cancel()
    assert [(m["kind"], m["body"]["sound"]) for m in dc.sent] == [("chimes", "bell")]


def test_uninstalled_it_is_gone() -> None:
    with installed(CHIMES):
        assert "chimes" in {k.value for k in EventKind}
    assert "chimes" not in {k.value for k in EventKind} and "chimes" not in [c.name for c in CAPABILITIES]
    assert "chimes" not in [p.capability for p in SERVICE_PLUGINS] and "vidsentry.*.chimes" not in durable_subjects()
    with pytest.raises(ValueError):
        EventKind("chimes")


def test_nothing_outside_its_package_names_it() -> None:
    named = [
        str(path.relative_to(ROOT))
        for top in ("realtime", "pipelines", "engines", "samples")
        for path in (ROOT / top).rglob("*")
        if path.is_file() and path.suffix in (".py", ".md", ".yaml", ".js", ".html") and "chime" in path.read_text()
    ]
    assert named == []


async def read_sse(response: aiohttp.ClientResponse, into: list[dict[str, Any]]) -> None:
    event: dict[str, Any] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if "event" in event:
                into.append(event)
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            event[name] = json.loads(value) if name == "data" else value


@contextlib.asynccontextmanager
async def subscribed(url: str, subjects: list[str]) -> AsyncIterator[list[tuple[str, dict[str, Any]]]]:
    got: list[tuple[str, dict[str, Any]]] = []
    nc = await nats.connect(url)

    async def on(msg: Any) -> None:
        got.append((msg.subject, json.loads(msg.data)))

    try:
        for subject in subjects:
            await nc.subscribe(subject, cb=on)
        yield got
    finally:
        await nc.close()


async def test_chimes_work_end_to_end_in_the_service(
    chimes: type[Config], detector: Detector, nats_server: EmbeddedNatsServer, vtest_avi: Path
) -> None:
    config = chimes.model_validate(
        {
            "node": "test",
            "supervisor": FAST_SUPERVISOR,
            "sources": OPEN_SOURCES,
            "http": {"sse_heartbeat_s": 1.0},
            "chimes": {"every_frames": 2},
        }
    )
    async with (
        live_service(
            detector, nats_server.url, config=config, opened={"chimes": config.section("chimes")}, timeline=True
        ) as svc,
        subscribed(nats_server.url, ["vidsentry.cam.chimes", "vidsentry.cam.alerts"]) as published,
    ):
        rules = [{"id": "bell", "type": "chime", "sound": "bell"}]
        reply = await svc.call("POST", "/api/streams", json_body=stream(vtest_avi, "cam", rules=rules))
        assert reply.status == 201, reply
        seen: list[dict[str, Any]] = []
        async with svc.session.get(svc.url + "/api/streams/cam/events") as response:
            reader = asyncio.create_task(read_sse(response, seen))
            await wait_until(lambda: sum(e["event"] == "chimes" for e in seen) >= 2, 30, "chimes over SSE")
            reader.cancel()
        await wait_until(
            lambda: any(s.endswith(".alerts") and d["rule_type"] == "chime" for s, d in published),
            20,
            "the chime rule's alert on NATS",
        )
        chime = next(d for s, d in published if s.endswith(".chimes"))
        assert chime["sound"] == "bell" and chime["stream_id"] == "cam"
        alert = next(d for s, d in published if s.endswith(".alerts"))
        assert (alert["rule_id"], alert["event"], alert["evidence"]["sound"]) == ("bell", "start", "bell")

        listed = await svc.call("GET", "/api/streams/cam/chimes")
        assert listed.status == 200 and listed.body["chimes"][0]["sound"] == "bell", listed

        found: dict[str, Any] = {}

        async def searched() -> bool:
            reply = await svc.call("GET", "/api/search?q=chime+bell&kind=chimes")
            assert reply.status == 200, reply
            found.update(reply.body)
            return bool(reply.body["hits"])

        for _ in range(100):
            if await searched():
                break
            await asyncio.sleep(0.1)
        assert found["hits"] and found["hits"][0]["kind"] == "chimes", found

        # A chime rule where chimes are off for the whole service is refused, as a vlm rule is without a VLM.
        svc.service.context.capabilities_on = frozenset()
        refused = await svc.call("POST", "/api/streams", json_body=stream(vtest_avi, "other", rules=rules))
        assert refused.status == 400 and "a chime rule needs chimes" in refused.body["detail"][0]["message"]
        assert (await svc.call("DELETE", "/api/streams/cam")).status == 204


def test_a_capability_or_a_kind_twice_is_refused() -> None:
    with installed(CHIMES), pytest.raises(ValueError, match="in the registry twice"), installed(CHIMES):
        pass
    assert "chimes" not in [c.name for c in CAPABILITIES]
    twice = dataclasses.replace(CHIMES, key=EngineKey("chimes-again"), section="again", switch=None, rules=())
    with installed(CHIMES, twice), pytest.raises(ValueError, match="'chimes' is declared twice"):
        list(EventKind)
    with pytest.raises(ValueError, match="rule type is declared twice"):
        rule_list((*CORE_RULES, ChimeRule, ChimeRule))
