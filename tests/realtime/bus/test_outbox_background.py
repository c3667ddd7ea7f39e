"""The disk outbox with its slow file work (fsync, merges, acks-log rewrites) on a worker thread:
the same results as inline, and what is on disk is consistent whenever the process could crash."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from pipelines.events import EventKind
from realtime.bus.outbox import Outbox

from .test_outbox import drain, segments, wire

pytestmark = pytest.mark.timeout(60)


def settle(outbox: Outbox) -> None:
    """Let the worker finish, and apply its results (which may hand it more work)."""
    for _ in range(10):
        assert outbox.wait_for_background_io(10)
        outbox.stats()  # applies finished work
        if outbox.wait_for_background_io(0):
            return
    raise AssertionError("background work never settled")


def test_bounds_and_compaction_hold_with_background_io(tmp_path: Path) -> None:
    box_dir = tmp_path / "outbox"
    max_bytes, segment_bytes = 16 * 1024, 4096
    with Outbox(box_dir, max_bytes=max_bytes, segment_bytes=segment_bytes, fsync_interval_s=1.0) as outbox:
        outbox.start_background_io()
        for i in range(3000):
            outbox.append(wire(EventKind.ALERTS if i % 50 == 0 else EventKind.TRACKS, i, severity="info"))
            assert outbox.bytes <= max_bytes
            if i % 7 == 0:  # a replay going on meanwhile: acks.log grows, segments empty out
                for record in outbox.take(3):
                    outbox.remove(record.seq)
                outbox.requeue()
        settle(outbox)
        stats = outbox.stats()
        assert stats.disk_bytes == sum(p.stat().st_size for p in segments(box_dir))
        assert stats.segments == len(segments(box_dir))
        assert stats.disk_bytes <= 2 * max_bytes + 3 * segment_bytes
        assert stats.write_errors == 0
        depth = outbox.depth
    assert not list(box_dir.glob("*.tmp"))
    with Outbox(box_dir) as outbox:
        assert outbox.depth == depth and outbox.stats().corrupt == 0
        kept = drain(outbox)
    assert kept[-1] == "tracks-cam1-2999"
    assert segments(box_dir) == [] and (box_dir / "acks.log").stat().st_size == 0


def test_what_is_on_disk_is_consistent_at_every_point_the_worker_can_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker is held inside every fsync it makes, and the directory is copied there (a crash
    of the process at that point leaves exactly that): reopening the copy finds exactly the
    records that are queued in memory. Removals written meanwhile go into a rewritten acks.log."""
    box_dir = tmp_path / "outbox"
    entered, permits = threading.Semaphore(0), threading.Semaphore(0)
    real_fsync = os.fsync
    main = threading.current_thread()

    def held_fsync(fd: int) -> None:
        if threading.current_thread() is not main:
            entered.release()
            assert permits.acquire(timeout=20), "test never let the worker go on"
        real_fsync(fd)

    outbox = Outbox(box_dir, segment_bytes=4096, fsync_interval_s=1.0)
    outbox.start_background_io()
    queued: dict[int, str] = {}
    for i in range(1400):
        msg = wire(EventKind.ALERTS if i % 10 == 0 else EventKind.TRACKS, i, severity="warning")
        queued[outbox.append(msg)] = msg.event_id
    records = outbox.take(10_000)
    settle(outbox)
    monkeypatch.setattr(os, "fsync", held_fsync)
    # The first 1100 all go at once (their files are deleted, acks.log wants a rewrite); then, a
    # few at each stop, the tracks after them (the alerts stay: sparse files to merge).
    later = [r.seq for r in records if r.seq > 1100 and r.kind is not EventKind.ALERTS]
    for seq in [r.seq for r in records if r.seq <= 1100]:
        assert outbox.remove(seq)
        del queued[seq]

    snapshots = 0
    caught: set[str] = set()  # what the worker was in the middle of
    while True:
        # Until the worker is held in an fsync, or idle (not while it deletes files).
        while not (stopped := entered.acquire(timeout=0.05)) and not outbox.wait_for_background_io(0):
            pass
        if not stopped and not later:
            break
        copy = tmp_path / f"crash{snapshots}"
        shutil.copytree(box_dir, copy, ignore=shutil.ignore_patterns("LOCK"))
        caught.update("acks rewrite" if p.name.startswith("acks") else "merge" for p in copy.glob("*.tmp"))
        snapshots += 1
        with Outbox(copy, fsync_interval_s=None) as reopened:
            assert reopened.stats().corrupt == 0
            assert drain(reopened) == list(queued.values()), f"at stop {snapshots}"
        shutil.rmtree(copy)
        if stopped:
            permits.release()
        for seq in later[:10]:
            assert outbox.remove(seq)
            del queued[seq]
        del later[:10]
    assert caught == {"acks rewrite", "merge"} and snapshots > 10
    assert outbox.wait_for_background_io(10)
    monkeypatch.setattr(os, "fsync", real_fsync)
    outbox.close()
    with Outbox(box_dir) as reopened:
        assert drain(reopened) == list(queued.values())
