"""An event viewer that reconnects with Last-Event-ID gets the durable events it missed from
JetStream, then the live ones: none twice, none lost. Real service, real nats-server; the events
enter where pipelines hand them over (the fan-out in front of the real publisher)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from engines.detector import Detector
from pipelines.events import EventKind
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.bodies import alert_event, any_event
from tests.support.service import LiveService, live_service, make_config
from tests.support.sse import sse_events
from tests.support.waiting import wait_until

UNREACHABLE = "rtsp://127.0.0.1:1/cam"  # the stream exists and keeps retrying; only its events matter


class Viewer:
    """One open event stream, parsed as it arrives."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.events: list[dict[str, Any]] = []
        self.last_id: str | None = None  # what EventSource would send as Last-Event-ID
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in sse_events(self.response):
            self.last_id = event.get("id", self.last_id)
            self.events.append(event)

    def seqs(self, kind: str = "alerts") -> list[int]:
        return [e["data"]["seq"] for e in self.events if e["event"] == kind and "seq" in e["data"]]

    def close(self) -> None:
        self._task.cancel()


@contextlib.asynccontextmanager
async def watching(svc: LiveService, stream_id: str, last_id: str | None = None) -> AsyncIterator[Viewer]:
    headers = {} if last_id is None else {"Last-Event-ID": last_id}
    async with svc.session.get(f"{svc.url}/api/streams/{stream_id}/events", headers=headers) as response:
        assert response.status == 200, await response.text()
        viewer = Viewer(response)
        try:
            yield viewer
        finally:
            viewer.close()


async def publish(svc: LiveService, stream_id: str, kind: EventKind, seqs: range) -> None:
    for seq in seqs:
        data = {"rule": "r", "event": "start", "seq": seq}
        await svc.service.fanout.publish(any_event(kind, stream_id, data, pts=None))


async def add_stream(svc: LiveService, stream_id: str) -> None:
    reply = await svc.call("POST", "/api/streams", json_body={"id": stream_id, "url": UNREACHABLE, "audio": False})
    assert reply.status == 201, reply


async def test_a_viewer_that_reconnects_gets_what_it_missed_once_then_live_events(svc: LiveService) -> None:
    await add_stream(svc, "resume")
    async with watching(svc, "resume") as first:
        await publish(svc, "resume", EventKind.ALERTS, range(5))
        await wait_until(lambda: first.seqs() == [0, 1, 2, 3, 4], 10, "the first alerts")
        last_id = first.last_id
    assert last_id is not None

    # Away: durable alerts and live detections the viewer does not see.
    await publish(svc, "resume", EventKind.ALERTS, range(5, 15))
    await publish(svc, "resume", EventKind.DETECTIONS, range(100, 120))
    assert await svc.service.publisher.flush(10)  # JetStream has stored them

    async with watching(svc, "resume", last_id) as second:
        await wait_until(lambda: any(e["event"] == "resume" for e in second.events), 10, "the resume summary")
        await publish(svc, "resume", EventKind.ALERTS, range(15, 18))
        await wait_until(lambda: 17 in second.seqs(), 10, "the live alerts")

    events = second.events
    summary = next(e for e in events if e["event"] == "resume")
    assert summary["data"]["found"] is True and summary["data"]["skipped"] == 0, summary
    assert second.seqs() == list(range(5, 18))  # in order, each once
    replayed = events[: events.index(summary)]
    assert not any(e["event"] == "detections" for e in replayed)  # live-only kinds are not kept
    assert [e["id"] for e in replayed if e["event"] == "alerts"] == [
        e["id"] for e in events if e["event"] == "alerts" and e["data"]["seq"] < 15
    ]
    ids = [e["id"] for e in events if e["event"] in ("alerts", "status")]
    assert len(ids) == len(set(ids)), "an event came twice"
    assert sorted(first.seqs() + second.seqs()) == list(range(18))


async def test_a_live_only_event_carries_the_id_of_the_durable_event_before_it(svc: LiveService) -> None:
    await add_stream(svc, "cursor")
    async with watching(svc, "cursor") as viewer:
        await publish(svc, "cursor", EventKind.ALERTS, range(1))
        await publish(svc, "cursor", EventKind.DETECTIONS, range(3))
        await wait_until(lambda: len(viewer.seqs("detections")) == 3, 10, "the detections")
    alert = next(e for e in viewer.events if e["event"] == "alerts")
    assert {e["id"] for e in viewer.events if e["event"] == "detections"} == {alert["id"]}


async def test_an_unknown_id_says_so_and_goes_on_live(svc: LiveService) -> None:
    await add_stream(svc, "unknown")
    async with watching(svc, "unknown", "no-such-event") as viewer:
        await wait_until(lambda: any(e["event"] == "resume" for e in viewer.events), 10, "the resume summary")
        await publish(svc, "unknown", EventKind.ALERTS, range(2))
        await wait_until(lambda: viewer.seqs() == [0, 1], 10, "live alerts")
    summary = next(e for e in viewer.events if e["event"] == "resume")["data"]
    assert summary["found"] is False and summary["replayed"] == 0 and "reason" in summary


async def test_a_replay_is_bounded_and_says_how_much_it_left_out(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    config = make_config(http={"sse_resume_max_events": 4})
    async with live_service(detector, shared_nats_server.url, config=config) as svc:
        await add_stream(svc, "bounded")
        async with watching(svc, "bounded") as first:
            await publish(svc, "bounded", EventKind.ALERTS, range(1))
            await wait_until(lambda: first.seqs() == [0], 10, "the first alert")
            last_id = first.last_id
        assert last_id is not None
        await publish(svc, "bounded", EventKind.ALERTS, range(1, 31))
        assert await svc.service.publisher.flush(10)
        async with watching(svc, "bounded", last_id) as second:
            await wait_until(lambda: any(e["event"] == "resume" for e in second.events), 10, "the resume summary")
        summary = next(e for e in second.events if e["event"] == "resume")["data"]
        replayed = summary["replayed"]
        # The newest four after the id; status events of the retrying stream may be among them.
        assert replayed == 4 and summary["skipped"] >= 26, summary
        seqs = second.seqs()
        assert seqs == list(range(31 - len(seqs), 31))


async def test_a_viewer_joining_mid_alert_learns_of_the_open_alerts_first(svc: LiveService) -> None:
    await add_stream(svc, "midway")
    published = {}
    for alert_id, event in (("a1", "start"), ("a2", "start"), ("a3", "start"), ("a1", "end")):
        published[alert_id, event] = alert_event("midway", alert_id, event)
        await svc.service.fanout.publish(published[alert_id, event])
    async with watching(svc, "midway") as viewer:
        await publish(svc, "midway", EventKind.DETECTIONS, range(1))
        await wait_until(lambda: viewer.seqs("detections") == [0], 10, "the live detections")
    kinds = [e["event"] for e in viewer.events]
    assert kinds[:3] == ["stream", "alerts", "alerts"], kinds  # before anything live
    opened = [e for e in viewer.events if e["event"] == "alerts"]
    assert [(a["data"]["alert_id"], a["data"]["event"]) for a in opened] == [("a2", "start"), ("a3", "start")]
    # Their SSE id is where the live events are (the newest durable event), not their own older one.
    assert len({a.get("id") for a in opened}) == 1
    assert not {a.get("id") for a in opened} & {published["a2", "start"].id, published["a3", "start"].id}

    # One that resumes gets what it missed replayed instead, not the open alerts again.
    await svc.service.fanout.publish(alert_event("midway", "a2", "end"))
    async with watching(svc, "midway", published["a1", "end"].id) as resumed:
        await wait_until(lambda: any(e["event"] == "resume" for e in resumed.events), 10, "the resume summary")
    said = [(e["data"]["alert_id"], e["data"]["event"]) for e in resumed.events if e["event"] == "alerts"]
    assert said == [("a2", "end")]
    assert [a.data["alert_id"] for a in svc.service.fanout.open_alerts("midway")] == ["a3"]

    assert (await svc.call("DELETE", "/api/streams/midway")).status == 204
    await wait_until(lambda: svc.service.fanout.open_alerts("midway") == [], 10, "the open alerts forgotten")
