"""NatsEventPublisher with a disk outbox, against a real nats-server that is killed and restarted
on the same port and store."""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

import pytest

from pipelines.events import Event, EventKind
from realtime.bus.connection import connect_nats, discard_unsent_publishes
from realtime.bus.delivery import WireMessage
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import STREAM_NAME
from realtime.bus.outbox import Outbox, OutboxWriteError
from realtime.bus.publisher import NatsEventPublisher
from tests.support.delivery import RecordingHooks
from tests.support.waiting import wait_until

from .jetstream_log import assert_exactly_once_in_order, stored_events
from .util import event, inspector

pytestmark = pytest.mark.timeout(90)


def outbox_publisher(url: str, directory: Path, max_events: int = 100_000) -> NatsEventPublisher:
    box = Outbox(directory, max_events=max_events, fsync_interval_s=None)
    return NatsEventPublisher(url, node="test", reconnect_wait=0.1, ack_timeout=2.0, outbox=box)


class Produced:
    """Events handed to publish(), durable ids per stream in order."""

    def __init__(self) -> None:
        self.by_stream: dict[str, list[str]] = defaultdict(list)

    async def publish(self, pub: NatsEventPublisher, ev: Event) -> None:
        await pub.publish(ev)
        if ev.durable:
            self.by_stream[ev.stream_id].append(ev.id)


def mixed(i: int) -> Event:
    stream = f"cam{i % 3}"
    if i % 7 == 0:
        return event(EventKind.ALERTS, stream, rule="fall", phase="start", severity="warning")
    if i % 11 == 0:
        return event(EventKind.STATUS, stream, state="live")
    return event(EventKind.TRACKS, stream, track_id=i, phase="update")


async def test_leftovers_of_a_previous_process_go_out_first(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    produced = Produced()
    first = outbox_publisher(nats_server.url, tmp_path / "outbox")
    await first.connect()
    for i in range(6):
        await produced.publish(first, mixed(i))
    assert await first.flush(10)
    assert first.stats.totals().spooled == 0  # a healthy broker: sent directly, as without an outbox

    nats_server.kill()
    await wait_until(lambda: not first.connected, what="publisher noticed the crash")
    for i in range(6, 40):
        await produced.publish(first, mixed(i))
        await first.publish(event(EventKind.DETECTIONS, f"cam{i % 3}"))
    assert first.stats.kind("detections").dropped == 34  # live-only, as before
    left = first.stats.outbox_depth
    assert left == 34
    await first.close()  # the broker is down: leaves them on disk, does not wait

    nats_server.restart()
    second = outbox_publisher(nats_server.url, tmp_path / "outbox")
    assert second.stats.outbox_depth == left
    await second.connect()
    for i in range(40, 60):  # right away: these queue behind the leftovers
        await produced.publish(second, mixed(i))
    assert await second.flush(20)

    assert_exactly_once_in_order(await stored_events(nats_server.url), produced.by_stream)
    stats = second.stats
    assert stats.outbox_depth == 0 and stats.outbox_replayed >= left
    assert stats.totals().acked == left + 20 and stats.totals().failed == 0
    await second.close()
    assert second.outbox is not None and second.outbox.closed


async def test_no_duplicates_when_the_broker_returns_while_acks_are_in_flight(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    produced = Produced()
    pub = outbox_publisher(nats_server.url, tmp_path / "outbox")
    pub.max_pending_acks = 200
    await pub.connect()
    try:
        for i in range(2000):
            await produced.publish(pub, mixed(i))
        assert pub.stats.pending_acks > 0  # a burst: acks still outstanding ...
        nats_server.kill()  # ... when the broker dies
        await wait_until(lambda: not pub.connected, what="publisher noticed the crash")
        for i in range(2000, 2600):
            await produced.publish(pub, mixed(i))
        assert pub.stats.outbox_depth >= 600  # plus what was still in flight at the crash

        nats_server.restart()
        # Kill it again mid-replay, with replays in flight, then bring it back for good.
        await wait_until(lambda: pub.stats.outbox_replayed > 0, within_s=20, what="replay started")
        nats_server.kill()
        await wait_until(lambda: not pub.connected, what="publisher noticed the second crash")
        nats_server.restart()
        assert await pub.flush(30)

        assert_exactly_once_in_order(await stored_events(nats_server.url), produced.by_stream)
        stats = pub.stats
        assert stats.totals().failed == 0 and stats.outbox_depth == 0
        assert stats.disconnects >= 2
    finally:
        await pub.close()


async def test_a_full_outbox_keeps_alerts_and_counts_what_it_drops(
    nats_server: EmbeddedNatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="realtime.bus.outbox")
    pub = outbox_publisher(nats_server.url, tmp_path / "outbox", max_events=20)
    await pub.connect()
    try:
        nats_server.kill()
        await wait_until(lambda: not pub.connected, what="publisher noticed the crash")
        alerts = [event(EventKind.ALERTS, rule="r", phase="start", severity="critical") for _ in range(5)]
        tracks = [event(EventKind.TRACKS, track_id=i) for i in range(30)]
        for ev in alerts + tracks:
            await pub.publish(ev)
        assert pub.stats.kind("tracks").dropped_overflow == 15
        assert "outbox full" in caplog.text

        nats_server.restart()
        assert await pub.flush(30)
        stored = [s.event_id for s in await stored_events(nats_server.url)]
        assert stored == [ev.id for ev in alerts + tracks[15:]]  # the oldest tracks went
        stats = pub.stats
        assert stats.kind("alerts").acked == 5 and stats.kind("alerts").dropped_overflow == 0
        assert stats.kind("tracks").published == stats.kind("tracks").acked + stats.kind("tracks").dropped_overflow
    finally:
        await pub.close()


async def test_a_disk_that_refuses_writes_hands_the_event_to_the_hooks(
    nats_server: EmbeddedNatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks = RecordingHooks()
    pub = outbox_publisher(nats_server.url, tmp_path / "outbox")
    pub.hooks = hooks
    await pub.connect()
    try:
        nats_server.kill()
        await wait_until(lambda: not pub.connected, what="publisher noticed the crash")

        def disk_full(msg: WireMessage) -> int:
            raise OutboxWriteError(28, "No space left on device")

        assert pub.outbox is not None
        monkeypatch.setattr(pub.outbox, "append", disk_full)
        await pub.publish(event(EventKind.CAPTIONS, text="lost"))  # must not raise
        assert hooks.errors == ["OutboxWriteError"]
        assert pub.stats.kind("captions").failed == 1
    finally:
        await pub.close()


async def test_unsent_publishes_nats_py_holds_after_a_disconnect_can_be_discarded(
    nats_server: EmbeddedNatsServer,
) -> None:
    # Guards the private nats-py state the publisher relies on to keep order after a reconnect.
    nc = await connect_nats(nats_server.url, connect_timeout=5, name="discard-test", reconnect_wait=0.1)
    try:
        assert discard_unsent_publishes(nc) == 0  # connected: never touches the buffer
        nats_server.kill()
        await wait_until(lambda: not nc.is_connected, what="client noticed the crash")
        for _ in range(3):
            await nc.publish("probe.stale", b"old", headers={"Nats-Msg-Id": "x"})
        assert nc.pending_data_size > 0
        assert discard_unsent_publishes(nc) == 3
        assert nc.pending_data_size == 0
    finally:
        await nc.close()


async def test_a_queued_event_the_broker_refuses_does_not_block_the_rest(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    hooks = RecordingHooks()
    pub = outbox_publisher(nats_server.url, tmp_path / "outbox")
    pub.hooks = hooks
    await pub.connect()
    try:
        nats_server.kill()
        await wait_until(lambda: not pub.connected, what="publisher noticed the crash")
        too_big = event(EventKind.DESCRIPTIONS, text="x" * (2 * 1024 * 1024))  # over max_payload
        fine = event(EventKind.DESCRIPTIONS, text="two people walking")
        await pub.publish(too_big)
        await pub.publish(fine)
        nats_server.restart()
        assert await pub.flush(30)
        assert [s.event_id for s in await stored_events(nats_server.url)] == [fine.id]
        assert hooks.errors == ["MaxPayloadError"]
        assert pub.stats.kind("descriptions").failed == 1
    finally:
        await pub.close()


async def test_a_stream_deleted_under_a_live_connection_is_recreated_and_nothing_is_lost(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    produced = Produced()
    pub = outbox_publisher(nats_server.url, tmp_path / "outbox")
    await pub.connect()
    try:
        async with inspector(nats_server.url) as insp:
            await insp.js.delete_stream(STREAM_NAME)
        # Sends fail while connected (no stream answers): they go through the outbox, in order.
        for i in range(50):
            await produced.publish(pub, mixed(i))
        assert await pub.flush(30)
        assert_exactly_once_in_order(await stored_events(nats_server.url), produced.by_stream)
        stats = pub.stats
        assert stats.totals().spooled > 0 and stats.totals().failed == 0
        assert stats.disconnects == 0
    finally:
        await pub.close()
