"""Compactor: gives the disk back what removed records still take.

A removed record stays in its segment file as a dead record, and its removal in acks.log; a file
whose records are all gone is deleted at once (`Segments`), the rest waits for compaction:

- a merge copies the live records of a run of adjacent old segments (at most one segment of live
  data together) into one file that replaces the first (atomic rename), then deletes the others.
  It runs when the dead bytes exceed the live ones by more than two segments (the run chosen frees
  the most dead bytes), or when there are more than 2 x max_bytes / segment_bytes + 8 files
  (scattered survivors, old alerts, could pin one file each; the run chosen frees the most files).
  A crash in between leaves records in two files; reopening keeps the first copy. The copy runs as
  file work; records removed meanwhile become dead records of the new file (their removal is in
  acks.log, which is not rewritten meanwhile). Together this keeps the disk at about
  2 x max_bytes + 3 segments.
- acks.log is rewritten (`AcksLog.rewrite`) when it holds more than 2 x (dead records still in
  files) + 1024 frames: most removals it lists belong to files that are gone.

At most one compaction (a merge or an acks-log rewrite) runs at a time; with background I/O the
next removal looks again. After one failed, or had to wait for a file that could not be deleted
(see `outbox_acks`), none starts for 5 seconds. The decisions and the merge's commit run on the
outbox's thread; the copy itself is file work, which reads each record's segment, offset and size
(only this merge's commit changes them).

Compaction is a pass over the write path's state, not a part of it: the outbox hands
`maybe_compact` the segments, the index and acks.log on each call, and the compactor keeps only its
own state (whether one runs, when the next may start) and its bounds. No part holds the compactor,
and it holds none of them between calls (a job under way holds what its commit will need).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from realtime.bus.outbox_acks import AcksLog, Rewrite
from realtime.bus.outbox_health import DiskHealth
from realtime.bus.outbox_index import Entry, RecordIndex
from realtime.bus.outbox_io import Commit, FileWork, close_quietly, write_all
from realtime.bus.outbox_segments import Segment, Segments

_MERGE_READ_BYTES = 1 << 20  # merges read and write about this much per syscall
_MERGE_GAP_BYTES = 64 << 10  # records closer than this in one file are read together
_COMPACT_RETRY_S = 5.0  # after a compaction failed or had to wait for a deletion


@dataclass(frozen=True, slots=True)
class _Merge:
    """A merge under way: what its copy reads, and what its commit is handed back."""

    segments: Segments
    index: RecordIndex
    group: list[Segment]  # adjacent old segments; the new file replaces the first
    entries: list[Entry]  # their live records when the copy was queued, in seq order


class Compactor:
    """Decides when to merge segments or rewrite acks.log, and runs the merges; see the module
    docstring. The state it works on is handed to each call."""

    def __init__(self, io: FileWork, health: DiskHealth, *, max_bytes: int, segment_bytes: int) -> None:
        self._io = io
        self._health = health
        self._segment_bytes = segment_bytes
        # Scattered survivors (old alerts) could pin one file each: merge past this many files.
        self._max_segments = 2 * -(-max_bytes // segment_bytes) + 8
        self._compacting = False  # a merge or an acks-log rewrite is under way
        self._not_before = 0.0  # a failed compaction waits before the next try

    def maybe_compact(self, segments: Segments, index: RecordIndex, acks: AcksLog) -> None:
        # One compaction at a time (with background I/O the next removal looks again).
        live_bytes = index.bytes
        too_much_dead = segments.disk_bytes - live_bytes > live_bytes + 2 * self._segment_bytes
        too_many_files = len(segments) > self._max_segments
        if self._not_before and time.monotonic() < self._not_before:
            return
        if not self._compacting and (too_much_dead or too_many_files):
            group = self._pick_merge(segments.old(), by_files=too_many_files)
            if group:
                self._merge(group, segments, index)
        if not self._compacting and acks.entries > 2 * segments.dead_total + 1024:
            self.rewrite_acks(segments, acks)  # most listed removals belong to files that are gone

    def rewrite_acks(self, segments: Segments, acks: AcksLog) -> None:
        """Keep only the removals that still matter: those of records still in some file."""
        self._compacting = True  # the rewrite counts as the one compaction under way
        self._io.run(partial(_replace_acks, acks, acks.start_rewrite(segments.dead_seqs()), self._acks_compacted))

    def empty_acks(self, acks: AcksLog) -> None:
        """After a reset, whose segment deletions are queued before this: no removal matters."""
        self._io.run(partial(_replace_acks, acks, acks.start_rewrite([]), self._acks_emptied))

    def _acks_compacted(self, failed: bool) -> None:
        self._compacting = False
        self._not_before = time.monotonic() + _COMPACT_RETRY_S if failed else 0.0

    def _acks_emptied(self, failed: bool) -> None:
        # A reset's rewrite is not the compaction under way; a failed one holds the next one back.
        if failed:
            self._not_before = time.monotonic() + _COMPACT_RETRY_S

    # -- merges -----------------------------------------------------------------------------------

    def _pick_merge(self, old: list[Segment], *, by_files: bool) -> list[Segment]:
        """The run of adjacent old segments, at most one segment of live data together, whose
        merge frees the most: files when there are too many, else dead bytes."""
        best: list[Segment] = []
        best_gain = 0
        for start in range(len(old)):
            group: list[Segment] = []
            live = 0
            for segment in old[start:]:
                if group and live + segment.live_bytes > self._segment_bytes:
                    break
                group.append(segment)
                live += segment.live_bytes
            gain = len(group) - 1 if by_files else sum(s.size for s in group) - live
            if gain > best_gain:
                best, best_gain = group, gain
        return best

    def _merge(self, group: list[Segment], segments: Segments, index: RecordIndex) -> None:
        """Copy the live records of `group` into one file that replaces the first, as file work;
        the commit then points the index at the new file and deletes the rest of the group."""
        self._compacting = True
        entries = [index[seq] for segment in group for seq in segment.records]
        self._io.run(partial(self._copy_live_records, _Merge(segments, index, group, entries)))

    def _copy_live_records(self, merge: _Merge) -> Commit:
        # File work: reads entry.segment/offset/size, which only this merge's commit changes.
        entries = merge.entries
        target = merge.group[0]
        tmp = target.path.with_name(target.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                offsets = _copy_records(entries, fd)
                self._io.fsync(fd)
            except BaseException:
                os.close(fd)
                raise
            os.replace(tmp, target.path)
            self._io.fsync_dir()
        except OSError as exc:
            with contextlib.suppress(OSError):  # a read-only directory refuses this too
                tmp.unlink(missing_ok=True)
            self._health.failed("compact", exc)
            return self._merge_failed
        self._health.ok("compact")
        return partial(self._merge_done, merge, fd, offsets)

    def _merge_failed(self) -> None:
        self._compacting = False
        self._not_before = time.monotonic() + _COMPACT_RETRY_S

    def _merge_done(self, merge: _Merge, fd: int, offsets: list[int]) -> None:
        self._compacting = False
        self._not_before = 0.0
        segments, index, group, entries = merge.segments, merge.index, merge.group, merge.entries
        target = group[0]
        if not segments.holds(target):
            # All its records went meanwhile: its deletion, queued after the copy, removes the new
            # file too; the rest of the group keeps its files as they are.
            self._io.run(partial(close_quietly, fd))
            return
        size = offsets[-1] + entries[-1].size if entries else 0
        dead: set[int] = set()
        live_bytes = 0
        for entry, offset in zip(entries, offsets, strict=True):
            if index.get(entry.seq) is not entry:
                dead.add(entry.seq)  # removed while it was copied: a dead record of the new file
                continue
            segments.move(entry.seq, entry.segment, target)
            entry.segment, entry.offset = target, offset
            live_bytes += entry.size
        for segment in group[1:]:
            if segments.holds(segment):
                segments.delete(segment)
        segments.replace_file(target, fd, size, dead, live_bytes)


def _replace_acks(acks: AcksLog, rewrite: Rewrite, done: Callable[[bool], None]) -> Commit:
    # File work; `done(failed)` runs on the outbox's thread.
    return partial(done, not acks.replace(rewrite))


def _copy_records(entries: list[Entry], fd: int) -> list[int]:
    """Write the records of `entries`, in order, to `fd`; returns each one's offset there.

    Few syscalls and little Python per record (this runs beside the event loop, which wants the
    GIL back quickly): records close together in one file are read with one pread, and what is
    gathered is written out about a megabyte at a time."""
    offsets: list[int] = []
    size = 0
    out: list[memoryview] = []
    out_bytes = 0
    span: list[Entry] = []  # records to read with one pread: same file, close together
    for entry in entries:
        if span:
            first, last = span[0], span[-1]
            end = last.offset + last.size
            same_file = entry.segment.fd == first.segment.fd and entry.offset >= end
            if not (
                same_file and entry.offset - end <= _MERGE_GAP_BYTES and entry.offset - first.offset < _MERGE_READ_BYTES
            ):
                out_bytes += _read_span(span, out)
                span = []
                if out_bytes >= _MERGE_READ_BYTES:
                    write_all(fd, b"".join(out))
                    out, out_bytes = [], 0
        span.append(entry)
        offsets.append(size)
        size += entry.size
    if span:
        _read_span(span, out)
    if out:
        write_all(fd, b"".join(out))
    return offsets


def _read_span(span: list[Entry], out: list[memoryview]) -> int:
    start = span[0].offset
    length = span[-1].offset + span[-1].size - start
    data = memoryview(os.pread(span[0].segment.fd, length, start))
    if len(data) != length:
        raise OSError(errno.EIO, f"short read: {len(data)} of {length} bytes")
    copied = 0
    for entry in span:
        out.append(data[entry.offset - start : entry.offset - start + entry.size])
        copied += entry.size
    return copied
