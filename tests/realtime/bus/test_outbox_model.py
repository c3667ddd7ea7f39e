"""The disk outbox against a model of what it should hold: random appends, leases, out-of-order
removals, requeues and reopens, with small segments so that merges, deletions and acks-log
rewrites happen all the time (inline and on the worker thread, where they overlap removals).
Whatever the interleaving, every record comes back exactly once, in order, and the disk
accounting matches the files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pipelines.events import EventKind
from realtime.bus.outbox import Outbox

from .test_outbox import drain, segments, wire
from .test_outbox_background import settle

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_operations_keep_every_record_exactly_once_in_order(tmp_path: Path, seed: int, background: bool) -> None:
    rng = random.Random(seed)
    box_dir = tmp_path / "outbox"
    queued: dict[int, str] = {}  # seq -> event id: what the outbox must hold, in seq order
    n = 0

    def open_outbox() -> Outbox:
        # Bounds well above what the run queues: nothing is dropped, so the model is exact.
        outbox = Outbox(box_dir, max_bytes=1 << 20, segment_bytes=2048, fsync_interval_s=1.0)
        if background:
            outbox.start_background_io()
        return outbox

    outbox = open_outbox()
    leased: list[int] = []
    for _round in range(1500):
        op = rng.random()
        if op < 0.45:
            kind = EventKind.ALERTS if rng.random() < 0.1 else EventKind.TRACKS
            msg = wire(kind, n, severity="critical")
            n += 1
            queued[outbox.append(msg)] = msg.event_id
        elif op < 0.65:
            leased += [record.seq for record in outbox.take(rng.randint(1, 20))]
        elif op < 0.93 and leased:
            # Acks come back out of order; the alerts are held longer (sparse files to merge).
            for seq in rng.sample(leased, min(len(leased), rng.randint(1, 8))):
                if queued[seq].startswith("alerts") and rng.random() < 0.8:
                    continue
                assert outbox.remove(seq)
                del queued[seq]
                leased.remove(seq)
        elif op < 0.98:
            outbox.requeue()
            leased.clear()
        else:
            if background:
                settle(outbox)
            outbox.close()
            outbox = open_outbox()
            leased.clear()
            assert outbox.depth == len(queued)
        assert outbox.depth == len(queued)
    if background:
        settle(outbox)
    stats = outbox.stats()
    assert stats.disk_bytes == sum(path.stat().st_size for path in segments(box_dir))
    assert stats.segments == len(segments(box_dir))
    assert stats.corrupt == 0 and stats.write_errors == 0
    outbox.close()

    with open_outbox() as reopened:
        assert drain(reopened) == list(queued.values())
    assert segments(box_dir) == []
