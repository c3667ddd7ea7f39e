"""The VIDSENTRY stream deleted under a live connection, with a plain subscriber on `vidsentry.>`
(issue 23, High 2): with a subscriber present NATS never answers "no responders", so durable
publishes just go unanswered. The publisher must find out from JetStream itself, make the stream
again, deliver what waited (exactly once, in order, with an outbox; counted and handed to the
hooks, never silently, without one), count it, and say "not ready" while it cannot store events.
Real nats-server, real nats-py subscriber; the subscriber stays for the whole test."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import nats.errors
import pytest
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from pipelines.events import Event
from realtime.bus.delivery import WireMessage
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import STREAM_NAME
from realtime.bus.outbox import Outbox
from realtime.bus.publisher import NatsEventPublisher
from tests.support.waiting import wait_until

from .jetstream_log import assert_exactly_once_in_order, stored_events
from .test_outbox_publisher import Produced, mixed
from .util import Inspector, inspector

pytestmark = pytest.mark.timeout(120)

_ACK_TIMEOUT_S = 1.0


class Undeliverable:
    """DeliveryHooks that keep what the publisher gave up on."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def on_acked(self, msg: WireMessage, delay_s: float, duplicate: bool) -> None:
        return None

    def on_undeliverable(self, msg: WireMessage, error: BaseException) -> None:
        self.ids.append(msg.event_id)


async def stream_exists(insp: Inspector) -> bool:
    try:
        await insp.js.stream_info(STREAM_NAME)
    except NotFoundError:
        return False
    except nats.errors.Error:  # the inspector itself reconnecting after a broker restart
        return False
    return True


async def publish_paced(
    pub: NatsEventPublisher, produced: Produced, events: list[Event], insp: Inspector
) -> float | None:
    """Publish at 25 events/s; return when (s after the first publish) the stream was seen again."""
    started = time.monotonic()
    seen_at: float | None = None
    for ev in events:
        await produced.publish(pub, ev)
        await asyncio.sleep(0.04)
        if seen_at is None and await stream_exists(insp):
            seen_at = time.monotonic() - started
    return seen_at


async def wait_for_stream(insp: Inspector, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not await stream_exists(insp):
        if time.monotonic() > deadline:
            raise AssertionError(f"stream {STREAM_NAME} not made again within {within_s} s while a subscriber listens")
        await asyncio.sleep(0.05)


async def test_with_an_outbox_a_stream_deleted_under_a_subscriber_is_made_again_and_nothing_is_lost(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    produced = Produced()
    box = Outbox(tmp_path / "outbox", fsync_interval_s=None)
    pub = NatsEventPublisher(nats_server.url, node="test", reconnect_wait=0.1, ack_timeout=_ACK_TIMEOUT_S, outbox=box)
    await pub.connect()
    try:
        async with inspector(nats_server.url) as insp:  # the plain subscriber, there throughout
            await insp.js.delete_stream(STREAM_NAME)
            seen_at = await publish_paced(pub, produced, [mixed(i) for i in range(100)], insp)
            await wait_for_stream(insp, within_s=15)
            assert await pub.flush(30), pub.stats
            assert pub.durable_ready
            assert len(insp.live) >= 100  # it heard every durable event while the stream was gone
        assert_exactly_once_in_order(await stored_events(nats_server.url), produced.by_stream)
        stats = pub.stats
        totals = stats.totals()
        print(f"stream seen again {seen_at} s after the first publish; stats {totals}")
        assert totals.failed == 0 and totals.dropped_overflow == 0
        assert totals.acked == 100  # each once, whichever way (duplicates of a re-send included)
        assert stats.stream_recreations == 1
        assert stats.outbox_depth == 0 and stats.pending_acks == 0
        assert stats.disconnects == 0
    finally:
        await pub.close()


@pytest.mark.parametrize("subscriber", [True, False], ids=["subscriber", "no-subscriber"])
async def test_without_an_outbox_a_deleted_stream_is_made_again_and_no_event_is_lost_silently(
    nats_server: EmbeddedNatsServer, subscriber: bool
) -> None:
    produced = Produced()
    hooks = Undeliverable()
    pub = NatsEventPublisher(nats_server.url, node="test", reconnect_wait=0.1, ack_timeout=_ACK_TIMEOUT_S, hooks=hooks)
    await pub.connect()
    try:
        async with inspector(nats_server.url, "vidsentry.>" if subscriber else "elsewhere.>") as insp:
            await insp.js.delete_stream(STREAM_NAME)
            await publish_paced(pub, produced, [mixed(i) for i in range(60)], insp)
            await wait_for_stream(insp, within_s=15)
            assert await pub.flush(30), pub.stats
        stored = [s.event_id for s in await stored_events(nats_server.url)]
        everything = [i for ids in produced.by_stream.values() for i in ids]
        assert len(stored) == len(set(stored)), "an event was stored twice"
        # Every event is either stored or reported: counted as failed and handed to the hooks.
        assert set(stored) | set(hooks.ids) == set(everything)
        stats = pub.stats
        assert stats.totals().failed == len(hooks.ids)
        assert stats.stream_recreations == 1
        # With the stream made again after the first unanswered send, the retries get through.
        assert hooks.ids == [] and sorted(stored) == sorted(everything)
    finally:
        await pub.close()


async def test_readiness_is_false_while_the_stream_cannot_be_made_and_the_counters_are_exported(
    nats_server: EmbeddedNatsServer, nudenet_model: Path, tmp_path: Path
) -> None:
    from engines.registry import create_detector
    from pipelines.detect import DetectionBatcher
    from realtime.service.service import Service
    from tests.support.service import make_config

    produced = Produced()
    detector = create_detector(nudenet_model, "onnx-cpu", threads=1)
    box = Outbox(tmp_path / "outbox", fsync_interval_s=None)
    config = make_config(nats={"outbox_dir": str(box.directory)})
    pub = NatsEventPublisher(nats_server.url, node="test", reconnect_wait=0.1, ack_timeout=_ACK_TIMEOUT_S, outbox=box)
    try:
        async with pub, DetectionBatcher(detector) as batcher:
            service = Service(config, batcher, pub)
            assert service.readiness()["jetstream"] is True
            async with inspector(nats_server.url) as insp:
                # The stream goes, and another one now takes part of its subjects: it cannot be
                # made again until an operator removes that one.
                await insp.js.delete_stream(STREAM_NAME)
                await insp.js.add_stream(StreamConfig(name="SQUATTER", subjects=["vidsentry.cam9.status"]))
                for i in range(20):
                    await produced.publish(pub, mixed(i))
                await wait_until(lambda: not service.readiness()["jetstream"], 15, "readiness to say no stream")
                assert service.readiness()["nats"] is True  # connected all along: the link is fine
                text = service.metrics.render().decode()
                assert "vidsentry_nats_stream_ready 0.0" in text
                assert pub.stats.totals().failed == 0  # waiting on disk, not given up

                await insp.js.delete_stream("SQUATTER")
                await wait_until(lambda: service.readiness()["jetstream"], 15, "the stream to be made again")
                assert await pub.flush(30), pub.stats
                text = service.metrics.render().decode()
                assert "vidsentry_nats_stream_ready 1.0" in text
                assert "vidsentry_nats_stream_recreations_total 1.0" in text
                assert "vidsentry_nats_stream_checks_total" in text
        assert_exactly_once_in_order(await stored_events(nats_server.url), produced.by_stream)
        assert pub.stats.totals().failed == 0
    finally:
        detector.close()


async def test_a_broker_back_without_its_store_under_a_subscriber_still_gets_everything_after_it(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    """What held in issue 23 keeps holding, subscriber or not: the reconnect finds the stream
    gone, makes it again (counted), and what was published from then on is stored exactly once."""
    produced = Produced()
    box = Outbox(tmp_path / "outbox", fsync_interval_s=None)
    pub = NatsEventPublisher(nats_server.url, node="test", reconnect_wait=0.1, ack_timeout=_ACK_TIMEOUT_S, outbox=box)
    await pub.connect()
    try:
        async with inspector(nats_server.url) as insp:
            for i in range(10):
                await produced.publish(pub, mixed(i))
            assert await pub.flush(10)
            nats_server.kill()
            assert nats_server.store_dir is not None
            shutil.rmtree(nats_server.store_dir / "jetstream")
            produced.by_stream.clear()  # acked before the wipe: gone with the store, not ours to keep
            for i in range(10, 30):
                await produced.publish(pub, mixed(i))
            nats_server.restart()
            await wait_for_stream(insp, within_s=20)
            for i in range(30, 55):
                await produced.publish(pub, mixed(i))
            assert await pub.flush(30), pub.stats
        assert_exactly_once_in_order(await stored_events(nats_server.url), produced.by_stream)
        stats = pub.stats
        assert stats.totals().failed == 0 and stats.stream_recreations == 1 and pub.durable_ready
    finally:
        await pub.close()
