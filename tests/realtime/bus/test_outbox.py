"""The disk outbox on its own: order, bounds, drop policy, crash recovery, disk errors."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.events import EventKind
from realtime.bus.delivery import WireMessage
from realtime.bus.outbox import Outbox, OutboxLockedError, OutboxWriteError


def wire(
    kind: EventKind = EventKind.TRACKS, n: int = 0, stream: str = "cam1", severity: str | None = None
) -> WireMessage:
    event_id = f"{kind.value}-{stream}-{n}"
    headers = {"ce-id": event_id, "Nats-Msg-Id": event_id, "ce-type": f"io.vidsentry.{kind.value}.v1"}
    payload = b'{"n":%d,"pad":"%s"}' % (n, b"x" * 40)
    return WireMessage(event_id, kind, f"vidsentry.{stream}.{kind.value}", payload, headers, time.monotonic(), severity)


def drain(outbox: Outbox) -> list[str]:
    """Take and remove everything, as a replay with all acks would; the event ids in order."""
    ids: list[str] = []
    while records := outbox.take(100):
        for record in records:
            ids.append(record.event_id)
            assert outbox.remove(record.seq)
    return ids


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("seg-*.log"))


@pytest.fixture
def box_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "outbox"


def test_records_come_back_whole_and_in_order_across_a_reopen(box_dir: Path) -> None:
    sent = [wire(kind, i, stream=f"cam{i % 3}") for i, kind in enumerate([EventKind.TRACKS, EventKind.STATUS] * 10)]
    with Outbox(box_dir) as outbox:
        for msg in sent:
            outbox.append(msg)
        first = outbox.take(5)
        assert [r.event_id for r in first] == [m.event_id for m in sent[:5]]
        for record in first:
            outbox.remove(record.seq)
        assert outbox.depth == 15
        assert outbox.bytes > 0 and outbox.oldest_age_s >= 0

    with Outbox(box_dir) as outbox:
        assert outbox.stats().recovered == 15
        records = outbox.take(100)
        for record, msg in zip(records, sent[5:], strict=True):
            assert (record.event_id, record.kind, record.subject) == (msg.event_id, msg.kind, msg.subject)
            assert (record.headers, record.payload, record.stream_id) == (msg.headers, msg.payload, msg.stream_id)
            wire_again = record.to_wire()
            assert wire_again.payload == msg.payload and wire_again.headers == msg.headers
        for record in records:
            outbox.remove(record.seq)
        assert outbox.depth == 0
    assert segments(box_dir) == []  # an empty outbox keeps no segment files
    assert (box_dir / "acks.log").stat().st_size == 0


def test_requeue_hands_leased_records_out_again_from_the_front(box_dir: Path) -> None:
    with Outbox(box_dir) as outbox:
        for i in range(6):
            outbox.append(wire(n=i))
        lease = outbox.take(4)
        outbox.remove(lease[1].seq)  # acks may come back out of order
        assert [r.event_id for r in outbox.take(10)] == ["tracks-cam1-4", "tracks-cam1-5"]
        assert outbox.requeue() == 5
        assert drain(outbox) == [f"tracks-cam1-{i}" for i in (0, 2, 3, 4, 5)]


def test_overflow_drops_other_kinds_first_then_alerts_by_severity(box_dir: Path) -> None:
    with Outbox(box_dir, max_events=6) as outbox:
        outbox.append(wire(EventKind.ALERTS, 0, severity="critical"))
        outbox.append(wire(EventKind.ALERTS, 1, severity="info"))
        outbox.append(wire(EventKind.ALERTS, 2, severity="warning"))
        for i in range(3, 6):
            outbox.append(wire(EventKind.TRACKS, i))
        assert outbox.dropped_overflow == {}
        outbox.append(wire(EventKind.STATUS, 6))  # over by one: the oldest non-alert goes
        outbox.append(wire(EventKind.ALERTS, 7, severity="critical"))
        assert outbox.dropped_overflow == {"tracks": 2}
        for i in range(8, 11):  # more alerts: the remaining tracks/status, then the info alert
            outbox.append(wire(EventKind.ALERTS, i, severity="warning"))
        assert outbox.dropped_overflow == {"tracks": 3, "status": 1, "alerts": 1}
        outbox.append(wire(EventKind.TRACKS, 11))  # nothing lower-ranked left but itself
        assert outbox.dropped_overflow == {"tracks": 4, "status": 1, "alerts": 1}
        outbox.append(wire(EventKind.ALERTS, 12, severity="critical"))  # oldest warning goes
        assert outbox.depth == 6
        kept = drain(outbox)
    assert kept == [
        "alerts-cam1-0",  # critical
        "alerts-cam1-7",  # critical
        "alerts-cam1-8",
        "alerts-cam1-9",
        "alerts-cam1-10",
        "alerts-cam1-12",
    ]


def test_overflow_never_drops_records_in_flight(box_dir: Path) -> None:
    with Outbox(box_dir, max_events=3) as outbox:
        for i in range(3):
            outbox.append(wire(n=i))
        lease = outbox.take(2)
        outbox.append(wire(n=3))  # record 2 goes, not the two being sent
        assert [r.event_id for r in lease] == ["tracks-cam1-0", "tracks-cam1-1"]
        outbox.requeue()
        assert drain(outbox) == ["tracks-cam1-0", "tracks-cam1-1", "tracks-cam1-3"]


def test_bytes_are_bounded_in_the_index_and_on_disk(box_dir: Path) -> None:
    max_bytes, segment_bytes = 16 * 1024, 4096
    with Outbox(box_dir, max_bytes=max_bytes, segment_bytes=segment_bytes, fsync_interval_s=None) as outbox:
        peak_disk = peak_acks = peak_files = 0
        for i in range(3000):
            # Old alerts outlive the tracks around them: holes that compaction must reclaim.
            outbox.append(wire(EventKind.ALERTS if i % 50 == 0 else EventKind.TRACKS, i, severity="info"))
            assert outbox.bytes <= max_bytes
            stats = outbox.stats()
            peak_disk, peak_files = max(peak_disk, stats.disk_bytes), max(peak_files, stats.segments)
            peak_acks = max(peak_acks, os.path.getsize(box_dir / "acks.log"))
        stats = outbox.stats()
        assert stats.dropped_overflow["tracks"] > 2800
        assert stats.disk_bytes == sum(p.stat().st_size for p in segments(box_dir))
        assert peak_disk <= 2 * max_bytes + 3 * segment_bytes
        assert peak_acks < 64 * 1024
        assert peak_files <= 2 * max_bytes // segment_bytes + 8  # sparse old files get merged
        depth = outbox.depth
    with Outbox(box_dir) as outbox:  # merged files read back whole
        assert outbox.depth == depth and outbox.stats().corrupt == 0
        kept = drain(outbox)
    assert len(kept) == depth
    assert kept[-1] == "tracks-cam1-2999"  # the newest survive
    assert sum(k.startswith("alerts") for k in kept) > sum(k.startswith("tracks") for k in kept)


def test_reopen_skips_a_torn_last_record(box_dir: Path) -> None:
    with Outbox(box_dir) as outbox:
        for i in range(5):
            outbox.append(wire(n=i))
    (segment,) = segments(box_dir)
    os.truncate(segment, segment.stat().st_size - 17)  # a crash in the middle of the last write
    with Outbox(box_dir) as outbox:
        assert outbox.stats().corrupt == 1
        outbox.append(wire(n=5))  # new records go to a new segment, after the damage
        assert drain(outbox) == ["tracks-cam1-0", "tracks-cam1-1", "tracks-cam1-2", "tracks-cam1-3", "tracks-cam1-5"]


def test_reopen_skips_a_record_with_a_flipped_byte_and_keeps_the_rest(box_dir: Path) -> None:
    with Outbox(box_dir) as outbox:
        sizes = []
        for i in range(5):
            outbox.append(wire(n=i))
            sizes.append(outbox.bytes)
    (segment,) = segments(box_dir)
    data = bytearray(segment.read_bytes())
    data[sizes[1] + 30] ^= 0x40  # inside record 2
    data[sizes[2] + 5] ^= 0x01  # record 3's length field: the reader must resync
    segment.write_bytes(bytes(data))
    with Outbox(box_dir) as outbox:
        assert outbox.stats().corrupt == 2  # each damaged record, counted once
        assert drain(outbox) == ["tracks-cam1-0", "tracks-cam1-1", "tracks-cam1-4"]


def test_a_torn_acks_file_resends_at_most_the_last_removal(box_dir: Path) -> None:
    with Outbox(box_dir) as outbox:
        for i in range(4):
            outbox.append(wire(n=i))
        for record in outbox.take(2):
            outbox.remove(record.seq)
    acks = box_dir / "acks.log"
    os.truncate(acks, acks.stat().st_size - 3)
    with Outbox(box_dir) as outbox:
        assert drain(outbox) == ["tracks-cam1-1", "tracks-cam1-2", "tracks-cam1-3"]


def test_a_second_outbox_on_the_same_directory_is_refused(box_dir: Path) -> None:
    with Outbox(box_dir), pytest.raises(OutboxLockedError, match="in use"):
        Outbox(box_dir)
    Outbox(box_dir).close()  # released on close


def test_a_full_disk_refuses_the_append_and_leaves_the_outbox_consistent(
    box_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Outbox(box_dir) as outbox:
        outbox.append(wire(n=0))
        real_write = os.write

        def half_then_enospc(fd: int, data: bytes | memoryview) -> int:
            if len(data) > 40:  # a record, not an ack
                real_write(fd, bytes(data[:10]))  # part of it lands, then the disk is full
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", half_then_enospc)
        with pytest.raises(OutboxWriteError) as info:
            outbox.append(wire(n=1))
        assert info.value.errno == errno.ENOSPC
        monkeypatch.undo()
        outbox.append(wire(n=2))
        assert outbox.depth == 2 and outbox.stats().write_errors == 1
    with Outbox(box_dir) as outbox:
        assert outbox.stats().corrupt == 0  # the partial record was cut off again
        assert drain(outbox) == ["tracks-cam1-0", "tracks-cam1-2"]


def test_constructor_bounds_apply_to_what_is_found_on_disk(box_dir: Path) -> None:
    with Outbox(box_dir) as outbox:
        for i in range(10):
            outbox.append(wire(n=i))
    with Outbox(box_dir, max_events=4) as outbox:
        assert outbox.dropped_overflow == {"tracks": 6}
        assert drain(outbox) == [f"tracks-cam1-{i}" for i in range(6, 10)]
