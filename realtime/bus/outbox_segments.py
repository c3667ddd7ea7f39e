"""Segments: the outbox's segment files, which records each one holds, and finding them on open.

Records are appended to the active segment, `seg-<first seq, 16 hex>.log`, framed as
`outbox_codec` describes; an append that would take it past `segment_bytes` retires it (fsynced
as file work) and opens a new one. A record is never rewritten in place: a removed one stays in
its file as a dead record (its removal is in acks.log) until the whole file goes, or a merge copies
the live records of sparse files into one (see `outbox_compaction`). Every segment keeps the seqs
and sizes of its live records, their bytes, and its dead seqs, so that the outbox knows what each
file is worth.

The segments sit below the index in the write path (codec → segments → index): they hand back
where a record went (its segment and offset) and know nothing of the index's entries, leases or
drop ranks; `RecordIndex` keeps those, pointing at the segment that holds each record.

A failed append leaves nothing behind: the partial frame is cut off again, or, when even that
fails, the segment is retired so that nothing follows the damage (reopening skips it).

Recovery on open: every `seg-*.log` is scanned; a damaged frame costs that record only (counted in
`corrupt`, the scan resyncs on the next magic), and of two copies of a record (a merge cut short by
a crash) the first counts. Records acks.log lists are dead; a file with no live record goes.

Descriptors: the outbox reads records with pread() on its own thread; a descriptor is closed, and
a file deleted, only by a job queued after every job that uses it (`FileWork` runs them in order).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from realtime.bus.outbox_codec import OutboxRecord, decode, decode_head, frame_at, scan
from realtime.bus.outbox_errors import OutboxWriteError
from realtime.bus.outbox_health import DiskHealth
from realtime.bus.outbox_io import FileWork, close_quietly, write_all

log = logging.getLogger("realtime.bus.outbox")  # the outbox's log, under the name it always had


@dataclass(slots=True, eq=False)
class Segment:
    path: Path
    fd: int
    size: int = 0  # bytes in the file
    live_bytes: int = 0
    records: dict[int, int] = field(default_factory=dict)  # live records in the file: seq -> size, seq order
    dead: set[int] = field(default_factory=set)  # removed seqs still in the file (so listed in acks.log)

    @property
    def live(self) -> int:
        return len(self.records)


@dataclass(frozen=True, slots=True)
class Found:
    """An intact record found on disk at open: where it is, and what the index needs of it."""

    seq: int
    segment: Segment
    offset: int
    size: int
    kind: str
    severity: str | None
    enqueued_at: float


class Segments:
    """The segment files of one outbox directory; see the module docstring. Lives on the outbox's
    thread; the file work it queues gets descriptors and paths, never the index."""

    def __init__(self, directory: Path, io: FileWork, health: DiskHealth, *, segment_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._io = io
        self._health = health
        self._files: dict[Path, Segment] = {}
        self.active: Segment | None = None  # the one appends go to
        self.disk_bytes = 0  # the files' size, dead records included
        self.dead_total = 0  # sum of len(segment.dead)

    def __len__(self) -> int:
        return len(self._files)

    def holds(self, segment: Segment) -> bool:
        """The segment is still one of the outbox's files (not deleted meanwhile)."""
        return self._files.get(segment.path) is segment

    def old(self) -> list[Segment]:
        """Every segment but the active one, oldest first."""
        return sorted((s for s in self._files.values() if s is not self.active), key=lambda s: s.path.name)

    def dead_seqs(self) -> list[int]:
        """The removed records still in some file: the removals acks.log must keep listing."""
        return [seq for segment in self._files.values() for seq in segment.dead]

    # -- recovery ---------------------------------------------------------------------------------

    def scan(self) -> tuple[dict[int, Found], int]:
        """Open every segment file and find its intact records (the first copy of each); returns
        them by seq, and how many damaged stretches were skipped."""
        found: dict[int, Found] = {}
        corrupt = 0
        for path in sorted(self.directory.glob("seg-*.log")):
            data = path.read_bytes()
            segment = self._files[path] = Segment(path, os.open(path, os.O_RDONLY), len(data))
            self.disk_bytes += len(data)
            for offset, size, body in scan(data):
                head = decode_head(body) if body is not None else None
                if head is not None and head[0] in found:
                    continue  # a second copy left by a merge cut short; the first one counts
                if head is None:
                    corrupt += 1
                    log.warning("outbox %s: skipped %d damaged bytes at offset %d", path.name, size, offset)
                    continue
                seq, enqueued_at, kind, severity = head
                found[seq] = Found(seq, segment, offset, size, kind, severity, enqueued_at)
        return found, corrupt

    def recover(self, found: dict[int, Found], removed: set[int]) -> list[Found]:
        """Sort what scan() found into dead records (acks.log lists them) and live ones; returns
        the live ones in seq order."""
        live: list[Found] = []
        for seq in sorted(found):
            record = found[seq]
            segment = record.segment
            if seq in removed:
                segment.dead.add(seq)
                self.dead_total += 1
                continue
            segment.records[seq] = record.size
            segment.live_bytes += record.size
            live.append(record)
        return live

    def delete_empty(self) -> None:
        for segment in list(self._files.values()):
            if segment.live == 0:
                self.delete(segment)

    # -- appending and reading --------------------------------------------------------------------

    def append(self, seq: int, frame: bytes) -> tuple[Segment, int]:
        """Write one framed record (to a new segment when the active one is full), count it as
        live there, and return where it went: the segment and the offset. Raises
        OutboxWriteError when the disk refuses: nothing was queued."""
        segment = self._writable(len(frame), seq)
        offset = segment.size
        try:
            write_all(segment.fd, frame)
        except OSError as exc:
            self._health.failed("append", exc)
            self._undo_write(segment, offset)
            raise OutboxWriteError(exc.errno or errno.EIO, f"outbox append failed: {exc.strerror or exc}") from exc
        self._health.ok("append")
        segment.size += len(frame)
        segment.live_bytes += len(frame)
        self.disk_bytes += len(frame)
        segment.records[seq] = len(frame)
        return segment, offset

    @staticmethod
    def read(seq: int, segment: Segment, offset: int, size: int) -> OutboxRecord | None:
        """Record `seq` back from disk, or None when it is unreadable or another record is there."""
        try:
            data = os.pread(segment.fd, size, offset)
        except OSError:
            return None
        body = frame_at(data, 0)
        record = decode(body) if body is not None else None
        return record if record is not None and record.seq == seq else None

    def _writable(self, size: int, seq: int) -> Segment:
        active = self.active
        if active is not None and active.size > 0 and active.size + size > self.segment_bytes:
            self.retire_active()
            active = None
        if active is None:
            path = self.directory / f"seg-{seq:016x}.log"
            try:
                fd = self._create_file(path)
            except OSError as exc:
                self._health.failed("append", exc)
                reason = f"cannot create outbox segment {path}: {exc.strerror}"
                raise OutboxWriteError(exc.errno or errno.EIO, reason) from exc
            self._io.run(self._io.fsync_dir)
            active = self.active = self._files[path] = Segment(path, fd)
        return active

    def _create_file(self, path: Path) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND
        try:
            return os.open(path, flags, 0o644)
        except FileExistsError:
            # An empty segment given up at this seq (a failed write) may still await deletion.
            if not self._io.background or not self._io.wait_idle():
                raise
            return os.open(path, flags, 0o644)

    def retire_active(self) -> None:
        active, self.active = self.active, None
        if active is None:
            return
        self._io.run(partial(self._io.fsync, active.fd))
        if active.live == 0:
            self.delete(active)

    def _undo_write(self, segment: Segment, offset: int) -> None:
        try:
            os.ftruncate(segment.fd, offset)
        except OSError:
            # Cannot cut the partial record off: stop appending here; reopening skips the tail.
            with contextlib.suppress(OSError):
                grown = os.fstat(segment.fd).st_size - segment.size
                segment.size += grown
                self.disk_bytes += grown
            self.retire_active()

    # -- removal ----------------------------------------------------------------------------------

    @staticmethod
    def release(seq: int, segment: Segment) -> None:
        """The record is no longer live in its segment (see mark_dead)."""
        segment.live_bytes -= segment.records.pop(seq)

    def mark_dead(self, seq: int, segment: Segment) -> None:
        """A released record stays in its file as a dead one; a file with nothing live left goes
        (unless appends still go to it)."""
        segment.dead.add(seq)
        self.dead_total += 1
        if segment.live == 0 and segment is not self.active:
            self.delete(segment)

    def delete(self, segment: Segment) -> None:
        """Forget the segment now; its file is closed and deleted by a job queued after every job
        that uses it."""
        self._files.pop(segment.path, None)
        if segment is self.active:
            self.active = None
        self.disk_bytes -= segment.size
        self.dead_total -= len(segment.dead)
        self._io.run(partial(self._io.delete_file, segment.fd, segment.path))

    def delete_all(self) -> None:
        for segment in list(self._files.values()):
            self.delete(segment)
        self.dead_total = 0

    # -- merges -----------------------------------------------------------------------------------

    @staticmethod
    def move(seq: int, source: Segment, target: Segment) -> None:
        """A live record copied by a merge now lives in `target` (the index is told its offset)."""
        if source is not target:
            target.records[seq] = source.records.pop(seq)

    def replace_file(self, target: Segment, fd: int, size: int, dead: set[int], live_bytes: int) -> None:
        """A merge's new file (`fd`, renamed over target's path) takes target's place; the old
        descriptor is closed by a job queued after its last reader."""
        self._io.run(partial(close_quietly, target.fd))
        self.disk_bytes += size - target.size
        self.dead_total += len(dead) - len(target.dead)
        target.fd, target.size, target.dead, target.live_bytes = fd, size, dead, live_bytes

    def close_all(self) -> None:
        for segment in self._files.values():
            close_quietly(segment.fd)
        self._files.clear()
        self.active = None
