"""The issue's scenario: events keep coming at a realistic rate while nats-server is down for
30 s; afterwards every durable event is stored exactly once, in production order per stream."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from pipelines.events import Event, EventKind
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.outbox import Outbox
from realtime.bus.publisher import NatsEventPublisher
from tests.support.waiting import wait_until

from .jetstream_log import assert_exactly_once_in_order, stored_events
from .util import camera, event

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

STREAMS = ("gate", "lobby", "yard")
RATE_PER_STREAM = 50 / len(STREAMS)  # 50 durable events/s in all
OUTAGE_S = 30.0
SEVERITIES = itertools.cycle(["info", "warning", "critical"])


def next_event(stream: str, i: int) -> Event:
    if i % 20 == 0:
        return event(EventKind.STATUS, stream, state="live")
    if i % 9 == 0:
        return event(EventKind.ALERTS, stream, rule="loiter", phase="start", severity=next(SEVERITIES))
    return event(EventKind.TRACKS, stream, track_id=i % 12, phase="update")


async def test_thirty_second_outage_loses_and_duplicates_nothing(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    pub = NatsEventPublisher(
        nats_server.url, node="test", reconnect_wait=0.25, ack_timeout=2.0, outbox=Outbox(tmp_path / "outbox")
    )
    await pub.connect()
    produced: dict[str, list[str]] = {stream: [] for stream in STREAMS}
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tg:
            for stream in STREAMS:
                paced = camera(
                    pub, stream, stop, produced[stream],
                    rate=RATE_PER_STREAM, next_event=next_event, with_detections=True,
                )
                tg.create_task(paced, name=f"camera-{stream}")
            await wait_until(lambda: pub.stats.totals().acked >= 50, 10, "a second of events acked before the outage")
            nats_server.kill()
            # The outage lasts as long as it takes to produce OUTAGE_S of events, which all queue on disk.
            queued = RATE_PER_STREAM * len(STREAMS) * OUTAGE_S
            await wait_until(lambda: pub.stats.outbox_depth >= queued, 3 * OUTAGE_S, f"{OUTAGE_S:g} s of events queued")
            during = pub.stats
            nats_server.restart()
            await wait_until(lambda: pub.connected, within_s=20, what="publisher reconnected")
            # Production goes on while the outbox drains.
            await wait_until(lambda: pub.stats.outbox_depth == 0, 30, "the outbox drained")
            stop.set()
        assert await pub.flush(30)

        assert during.outbox_depth >= 0.8 * 50 * OUTAGE_S  # the outage really queued on disk
        assert not during.connected
        assert_exactly_once_in_order(await stored_events(nats_server.url), produced)
        stats = pub.stats
        totals = stats.totals()
        assert totals.failed == 0 and totals.dropped_overflow == 0
        assert totals.acked == sum(map(len, produced.values()))
        assert stats.outbox_depth == 0 and stats.outbox_replayed >= during.outbox_depth
        assert stats.kind("detections").dropped > 0  # live-only data is still not kept
    finally:
        stop.set()
        await pub.close()
