"""The publisher through a broker crash: kill -9, restart on the same port and store."""

from __future__ import annotations

import shutil

import pytest

from pipelines.events import EventKind
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from tests.support.waiting import wait_until

from .util import event, inspector

pytestmark = pytest.mark.timeout(90)


async def test_publisher_survives_broker_kill_and_restart(nats_server: EmbeddedNatsServer) -> None:
    pub = NatsEventPublisher(nats_server.url, reconnect_wait=0.1, ack_timeout=2.0)
    await pub.connect()
    try:
        before = [event(EventKind.STATUS, state="live") for _ in range(10)]
        for ev in before:
            await pub.publish(ev)
        assert await pub.flush(10)

        nats_server.kill()
        await wait_until(lambda: not pub.connected, what="publisher noticed the crash")
        during = [event(EventKind.TRACKS, track_id=i, phase="update") for i in range(10)]
        for ev in during:
            await pub.publish(ev)  # must not raise, must not block for long
            await pub.publish(event(EventKind.DETECTIONS))
        assert pub.stats.kind("detections").dropped == 10  # live-only data is not buffered

        nats_server.restart()
        await wait_until(lambda: pub.connected, within_s=20, what="publisher reconnected")
        after = [event(EventKind.STATUS, state="live", note="after restart") for _ in range(10)]
        for ev in after:
            await pub.publish(ev)
        assert await pub.flush(30)

        async with inspector(nats_server.url) as insp:
            stored_ids = {m.headers["ce-id"] for m in await insp.stored() if m.headers}
        assert {ev.id for ev in before} <= stored_ids  # the file store survived the crash
        assert {ev.id for ev in after} <= stored_ids  # publishing works again after reconnect

        stats = pub.stats
        assert stats.disconnects >= 1 and stats.reconnects >= 1
        assert stats.pending_acks == 0 and stats.retry_backlog == 0
        for kind in ("status", "tracks"):
            k = stats.kind(kind)
            assert k.published == k.acked + k.failed, f"{kind}: every event is acked or failed"
        # Events from the outage were either delivered or counted as failed; none vanished.
        missing = {ev.id for ev in during} - stored_ids
        assert len(missing) <= stats.kind("tracks").failed
    finally:
        await pub.close()


async def test_outage_longer_than_the_ack_timeout_is_retried_after_reconnect(
    nats_server: EmbeddedNatsServer,
) -> None:
    pub = NatsEventPublisher(nats_server.url, reconnect_wait=0.1, ack_timeout=0.3)
    await pub.connect()
    try:
        nats_server.kill()
        await wait_until(lambda: not pub.connected, what="publisher noticed the crash")
        during = [event(EventKind.ALERTS, rule="fall", phase="start") for _ in range(5)]
        for ev in during:
            await pub.publish(ev)
        # Every ack times out while the broker is down; the retries wait for the reconnect.
        await wait_until(lambda: pub.stats.retry_backlog == len(during), what="acks timed out")
        assert pub.stats.kind("alerts").failed == 0

        # Back up, JetStream recovers its stream before it acks: a short ack timeout there spends
        # the retries left on a loaded machine. The outage above is what 0.3 s was for.
        pub.ack_timeout = 5.0
        nats_server.restart()
        assert await pub.flush(30)
        async with inspector(nats_server.url) as insp:
            stored = [m.headers["ce-id"] for m in await insp.stored() if m.headers]
        assert sorted(stored) == sorted(ev.id for ev in during)  # each exactly once: dedup
        alerts = pub.stats.kind("alerts")
        assert alerts.acked == len(during) and alerts.failed == 0
        assert alerts.retries >= len(during)
    finally:
        await pub.close()


async def test_broker_back_without_its_store_gets_the_stream_recreated(
    nats_server: EmbeddedNatsServer,
) -> None:
    pub = NatsEventPublisher(nats_server.url, reconnect_wait=0.1, ack_timeout=1.0)
    await pub.connect()
    try:
        nats_server.kill()
        assert nats_server.store_dir is not None
        shutil.rmtree(nats_server.store_dir / "jetstream")
        nats_server.restart()
        await wait_until(lambda: pub.connected, within_s=20, what="publisher reconnected")
        ev = event(EventKind.STATUS, state="live")
        await pub.publish(ev)
        assert await pub.flush(30)
        async with inspector(nats_server.url) as insp:
            stored = [m.headers["ce-id"] for m in await insp.stored() if m.headers]
        assert stored == [ev.id]
    finally:
        await pub.close()
