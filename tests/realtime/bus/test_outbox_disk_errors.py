"""Disk errors in the outbox, made for real (a read-only directory, a full disk): handled, counted,
reported, and never the cause of an acked record being sent again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipelines.events import EventKind
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.outbox import Outbox, OutboxWriteError
from realtime.bus.publisher import NatsEventPublisher
from tests.support.waiting import wait_until

from .disk_faults import fill, read_only, small_disk
from .jetstream_log import assert_exactly_once_in_order, stored_events
from .test_outbox import wire
from .util import event

pytestmark = pytest.mark.timeout(90)


async def test_a_read_only_outbox_directory_during_an_outage_sends_no_acked_event_twice(
    nats_server: EmbeddedNatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    box = tmp_path / "outbox"
    pub = NatsEventPublisher(nats_server.url, node="test", reconnect_wait=0.1, ack_timeout=2.0, outbox=Outbox(box))
    await pub.connect()
    produced: list[str] = []
    try:
        for i in range(3):
            ev = event(EventKind.TRACKS, "gate", n=i)
            await pub.publish(ev)
            produced.append(ev.id)
        assert await pub.flush(10)
        nats_server.kill()
        await wait_until(lambda: not pub.connected, what="the publisher to see the outage")
        for i in range(3, 23):
            ev = event(EventKind.TRACKS, "gate", n=i)
            await pub.publish(ev)
            produced.append(ev.id)
        assert pub.stats.outbox_depth == 20

        # The directory stops taking changes (chattr +i, a read-only remount) while NATS is away:
        # the replay still writes its removals to the open acks log, but no file can be deleted.
        with read_only(box):
            nats_server.restart()
            await wait_until(lambda: pub.stats.outbox_depth == 0, within_s=30, what="the outbox to drain")
            assert await pub.flush(10)
            stats = pub.stats
            assert pub.alive, pub.failure
            assert stats.totals().acked == len(produced) and stats.totals().failed == 0
            # Deleting the drained segment is background I/O: it may fail a moment after the drain.
            await wait_until(lambda: pub.stats.outbox_disk_errors.get("delete", 0) >= 1, within_s=10,
                             what=lambda: f"the failed delete to be counted: {pub.stats.outbox_disk_errors}")
            assert not pub.outbox_writable
        # Writable again: the outbox's housekeeping finishes what it could not do.
        await wait_until(lambda: pub.outbox_writable, within_s=10, what="the outbox to recover")
    finally:
        await pub.close()

    crashes = ("Exception in callback", "background job failed", "task crashed")
    assert not [r for r in caplog.records if any(c in r.getMessage() for c in crashes)]
    delete_lines = [r for r in caplog.records if r.levelno >= logging.WARNING and "delete" in r.getMessage()]
    assert len(delete_lines) == 1, [r.getMessage() for r in delete_lines]  # one line per kind of error
    with Outbox(box) as reopened:
        assert reopened.depth == 0  # a later start has nothing to send again
    assert_exactly_once_in_order(await stored_events(nats_server.url), {"gate": produced})


def test_removals_a_full_disk_refuses_are_kept_and_written_once_it_has_room(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with small_disk(tmp_path / "disk", 256 * 1024) as disk:
        box = disk / "outbox"
        with Outbox(box, segment_bytes=1 << 20, fsync_interval_s=None) as outbox:
            for i in range(600):
                outbox.append(wire(n=i))
            filler = fill(disk)  # acks.log is still empty: not one removal fits
            records = outbox.take(600)
            for record in records[:-5]:
                assert outbox.remove(record.seq)  # acked: gone for this process, whatever the disk says
            assert outbox.depth == 5
            assert not outbox.writable
            errors = outbox.stats().disk_errors
            assert errors.get("remove", 0) >= 1, errors
            remove_lines = [r for r in caplog.records if r.levelno >= logging.WARNING and "remove" in r.getMessage()]
            assert len(remove_lines) == 1, [r.getMessage() for r in remove_lines]

            filler.unlink()
            outbox.sync()  # housekeeping writes the removals it kept
            assert outbox.writable
        with Outbox(box) as reopened:
            assert [r.seq for r in reopened.take(10)] == [r.seq for r in records[-5:]]


def test_removals_still_unwritten_at_close_are_said_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with (
        small_disk(tmp_path / "disk", 128 * 1024) as disk,
        Outbox(disk / "outbox", segment_bytes=1 << 20, fsync_interval_s=None) as outbox,
    ):
        for i in range(20):
            outbox.append(wire(n=i))
        fill(disk)
        for record in outbox.take(10):
            outbox.remove(record.seq)
        assert outbox.stats().removals_unrecorded == 10
    lines = [r.getMessage() for r in caplog.records if "sent again" in r.getMessage()]
    assert len(lines) == 1 and "10" in lines[0], lines


async def test_readyz_and_metrics_report_an_outbox_that_cannot_write(
    shared_nats_server: EmbeddedNatsServer, nudenet_model: Path, tmp_path: Path
) -> None:
    from engines.registry import create_detector
    from pipelines.detect import DetectionBatcher
    from realtime.service.service import Service
    from tests.support.service import make_config

    detector = create_detector(nudenet_model, "onnx-cpu", threads=1)
    with small_disk(tmp_path / "disk", 128 * 1024) as disk:
        box = disk / "outbox"
        config = make_config(nats={"outbox_dir": str(box)})
        outbox = Outbox(box, fsync_interval_s=None)
        try:
            async with (
                NatsEventPublisher(shared_nats_server.url, node="test", outbox=outbox) as pub,
                DetectionBatcher(detector) as batcher,
            ):
                service = Service(config, batcher, pub)
                assert service.readiness()["outbox"] is True
                filler = fill(disk)
                with pytest.raises(OutboxWriteError):
                    outbox.append(wire(n=1, stream="gate"))
                assert service.readiness()["outbox"] is False
                text = service.metrics.render().decode()
                assert 'vidsentry_outbox_disk_errors_total{op="append"} 1.0' in text

                filler.unlink()
                outbox.sync()  # the housekeeping the publisher runs every second
                await wait_until(lambda: service.readiness()["outbox"], what="the outbox to write again")
        finally:
            detector.close()
