"""A bounded, disk-backed outbox: durable events wait here while NATS cannot take them.

Directory layout (one outbox per publisher; a lock file keeps a second process out):

    LOCK                         flock()ed while an Outbox has the directory open
    seg-<first seq, 16 hex>.log  append-only segments of framed records
    acks.log                     framed sequence numbers of records that left (acked or dropped)

Every frame is `"VSOB" | u32 body length | u32 CRC-32 of the body | body`, so a torn write or a
flipped bit costs exactly the damaged record: reopening skips it (counted in `corrupt`), resyncs
on the next magic and never raises. Records carry a sequence number; replay order is sequence
order, whatever file a record sits in.

Durability trade-off: each append and each removal is one write() to the OS before the call
returns, so a crash of this process loses nothing. fsync() runs at most every
`fsync_interval_s` (and on segment rotation, compaction and close), so a power cut can lose that
last interval (and, with background I/O, an fsync still under way); a removal lost that way only
means a re-send, which JetStream drops as a duplicate by Nats-Msg-Id within its window.
`fsync_interval_s=None` never fsyncs: process crashes are still covered, power cuts are not (for
tests and throwaway deployments).

Bounds: `max_events` and `max_bytes` cap what is queued (leased records included). Past them
the oldest record of the lowest rank goes: other kinds first, then info, warning and critical
alerts. Dead bytes are reclaimed by deleting fully removed segments and merging sparse ones, so
the disk holds at most about 2 x max_bytes + 3 segments, in at most 2 x max_bytes / segment_bytes
+ 8 files (each with an open descriptor).

Background I/O: after `start_background_io()` the slow file work (fsync, segment merges, acks-log
rewrites, closing and deleting files) runs on one worker thread (`DiskWorker`, in order), so calls
from an event loop only make cheap syscalls (the append's write(), a removal's write(), pread, the
open() of a new segment). Hand-off rules that keep that safe: the index lives on the caller's
thread only, and a job's result is applied there at the next call; a file descriptor is closed,
and a file deleted, only by a job queued after every job that uses it; at most one compaction (a
merge or an acks-log rewrite) runs at a time; a removal written while an acks-log rewrite runs
also goes into the new file, under a lock held only while the new file takes over. Until a job's
result is applied, `stats()` counts files and bytes as the index sees them. Without background
I/O (the default) the same work runs inline, in the calling thread.

Disk errors: a write, fsync, deletion or compaction the disk refuses never raises out of
removal or housekeeping; `DiskHealth` counts it by kind, logs the first of each kind, and makes
the outbox not `writable` until that kind of work succeeds again (`sync()` retries it). acks.log
is the source of truth for what left: a removal that cannot be written there is kept in memory
and written with the next one (or by `sync()` / `close()`), so a record acked in this process is
never replayed by it; a file that cannot be deleted keeps acks.log from being rewritten (which
would forget the removals of the records in it) until the deletion succeeds. Only an append
raises (OutboxWriteError): that one record was not queued.

Not thread-safe: call it from one thread (the publisher's event loop); only the worker thread it
starts itself shares it, as described above.

`Outbox` is the one facade; the parts, each in its own module with the details in its docstring,
hold no reference to one another (only to `FileWork` and `DiskHealth`, below them all). Data flows
one way. A record is written along the write path: the codec frames it, the segments store it and
say where, the index keeps that location (an index entry points at its segment; a segment knows
only the seqs and sizes of its records). Removals, compaction and housekeeping are passes the
facade runs over that state, handing each what it needs on the call; the facade decides the order
of their steps (a removal is logged in acks.log before its file may go; on a reset the segments go
before acks.log is emptied; bounds are enforced on open and after each append):

    outbox_codec         the record format: framing, encoding, scanning with resync
    outbox_segments      Segments: the segment files, each one's live and dead records, recovery
    outbox_index         RecordIndex: the records in replay order, their leases, the drop policy
    outbox_acks          AcksLog: acks.log, the removals it refused, its rewrite
    outbox_compaction    Compactor: the pass that decides when and what to merge or rewrite
    outbox_housekeeping  Housekeeping: the pass that fsyncs on an interval and retries failed work
    outbox_io            FileWork / DiskWorker: where file work runs (inline or on the worker)
    outbox_health        DiskHealth: which kinds of file work fail, counted and logged
    outbox_errors        the exceptions (re-exported here)
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from realtime.bus.delivery import WireMessage
from realtime.bus.outbox_acks import ACKS_NAME, AcksLog
from realtime.bus.outbox_codec import SEVERITY_CODE, OutboxRecord, encode, frame_record
from realtime.bus.outbox_compaction import Compactor
from realtime.bus.outbox_errors import OutboxClosedError, OutboxError, OutboxLockedError, OutboxWriteError
from realtime.bus.outbox_health import DiskHealth
from realtime.bus.outbox_housekeeping import Housekeeping
from realtime.bus.outbox_index import SEVERITIES, Entry, RecordIndex, drop_rank
from realtime.bus.outbox_io import FileWork, close_quietly
from realtime.bus.outbox_segments import Segments

__all__ = [
    "SEVERITIES",
    "Outbox",
    "OutboxClosedError",
    "OutboxError",
    "OutboxLockedError",
    "OutboxRecord",
    "OutboxStats",
    "OutboxWriteError",
    "drop_rank",
]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class OutboxStats:
    depth: int  # records queued (in flight to the broker included)
    bytes: int  # their size on disk, framing included; bounded by max_bytes
    disk_bytes: int  # segment files, dead records included
    segments: int
    oldest_age_s: float
    appended: int  # since open
    removed: int  # acknowledged and removed since open
    recovered: int  # records found on disk at open
    corrupt: int  # damaged records (or stretches) skipped
    write_errors: int  # disk errors of every kind (sum of disk_errors)
    dropped_overflow: dict[str, int] = field(default_factory=dict)
    disk_errors: dict[str, int] = field(default_factory=dict)  # by kind: append, remove, delete, compact, fsync
    removals_unrecorded: int = 0  # removals acks.log has refused so far, kept in memory to write later
    removals_forgotten: int = 0  # of those, given up past the cap (their records may be sent again)


class Outbox:
    """Append-only segments plus an in-memory index, put together from the parts the module
    docstring lists; see there for the contract."""

    def __init__(
        self,
        directory: Path,
        *,
        max_events: int = 100_000,
        max_bytes: int = 256 * 2**20,
        segment_bytes: int | None = None,
        fsync_interval_s: float | None = 1.0,
    ) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ValueError("max_events and max_bytes must be >= 1")
        self.directory = Path(directory)
        segment_bytes = segment_bytes or min(4 * 2**20, max(max_bytes // 4, 4096))

        self._index = RecordIndex(max_events=max_events, max_bytes=max_bytes)
        self._next_seq = 1
        self._closed = False
        self._appended = self._removed = self._recovered = self._corrupt = 0
        self._health = DiskHealth(self.directory)

        self._io = FileWork(self.directory, self._health, fsync=fsync_interval_s is not None)
        self._segments = Segments(self.directory, self._io, self._health, segment_bytes=segment_bytes)
        self._acks = AcksLog(self.directory, self._io, self._health, max_events=max_events)
        self._compactor = Compactor(self._io, self._health, max_bytes=max_bytes, segment_bytes=segment_bytes)
        self._housekeeping = Housekeeping(self._io, self._health, fsync_interval_s=fsync_interval_s)

        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = _lock(self.directory)
        try:
            self._load()
            self._acks.open()
            self._compactor.rewrite_acks(self._segments, self._acks)
            self._enforce_bounds()
        except BaseException:
            self._close_fds()
            raise
        log.info(
            "outbox opened dir=%s depth=%d bytes=%d corrupt=%d",
            self.directory,
            self.depth,
            self._index.bytes,
            self._corrupt,
        )

    # -- settings and metrics ---------------------------------------------------------------------

    @property
    def max_events(self) -> int:
        return self._index.max_events

    @property
    def max_bytes(self) -> int:
        return self._index.max_bytes

    @property
    def segment_bytes(self) -> int:
        return self._segments.segment_bytes

    @property
    def fsync_interval_s(self) -> float | None:
        return self._housekeeping.fsync_interval_s

    @property
    def depth(self) -> int:
        return len(self._index)

    @property
    def bytes(self) -> int:
        return self._index.bytes

    @property
    def oldest_age_s(self) -> float:
        oldest = self._index.oldest()
        if oldest is None:
            return 0.0
        return max(0.0, time.time() - oldest.enqueued_at)

    @property
    def dropped_overflow(self) -> dict[str, int]:
        return self._index.dropped

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def needs_sync(self) -> bool:
        """sync() has work: written since the last fsync (and fsync is on), or disk work that
        failed waits for a retry."""
        return not self._closed and self._housekeeping.needs_sync

    @property
    def writable(self) -> bool:
        """No kind of file work is failing (see `DiskHealth`); readiness reports this."""
        return self._health.writable

    @property
    def disk_errors(self) -> dict[str, int]:
        """Disk errors since open, by kind (append, remove, delete, compact, fsync)."""
        return self._health.counts

    def stats(self) -> OutboxStats:
        self._io.apply_finished()
        return OutboxStats(
            depth=self.depth,
            bytes=self._index.bytes,
            disk_bytes=self._segments.disk_bytes,
            segments=len(self._segments),
            oldest_age_s=self.oldest_age_s,
            appended=self._appended,
            removed=self._removed,
            recovered=self._recovered,
            corrupt=self._corrupt,
            write_errors=self._health.total,
            dropped_overflow=self.dropped_overflow,
            disk_errors=self._health.counts,
            removals_unrecorded=self._acks.unrecorded,
            removals_forgotten=self._acks.forgotten,
        )

    # -- queueing ---------------------------------------------------------------------------------

    def append(self, msg: WireMessage) -> int:
        """Queue one durable message; returns its sequence number. May drop older records (or this
        one) to stay inside the bounds. Raises OutboxWriteError when the disk refuses the write."""
        self._check_open()
        self._io.apply_finished()
        severity = msg.severity if msg.severity in SEVERITY_CODE else None
        seq = self._next_seq
        enqueued_at = time.time()
        # The write path, one way: codec, then segments, then index.
        frame = frame_record(encode(seq, enqueued_at, msg, severity))
        segment, offset = self._segments.append(seq, frame)
        self._next_seq += 1
        kind = msg.kind.value
        self._index.add(Entry(seq, segment, offset, len(frame), kind, drop_rank(kind, severity), enqueued_at))
        self._appended += 1
        self._housekeeping.dirty = True
        self._enforce_bounds()
        self._maybe_sync()
        return seq

    def take(self, limit: int) -> list[OutboxRecord]:
        """Lease the next `limit` records not yet handed out, oldest first. They stay queued until
        remove(seq); requeue() hands them out again from the front."""
        self._check_open()
        self._io.apply_finished()
        out: list[OutboxRecord] = []
        damaged: list[Entry] = []
        # The leased records are a prefix of the index (taken in order, requeued all at once), so
        # this walks at most the in-flight window before it finds new ones.
        for entry in self._index:
            if len(out) >= limit:
                break
            if entry.leased:
                continue
            record = self._segments.read(entry.seq, entry.segment, entry.offset, entry.size)
            if record is None:
                damaged.append(entry)
                continue
            entry.leased = True
            out.append(record)
        for entry in damaged:
            self._corrupt += 1
            log.warning("outbox record seq=%d unreadable on disk, skipped", entry.seq)
            self._remove(entry)
        return out

    def requeue(self) -> int:
        """Hand every leased record out again, in order (after a failed or aborted send)."""
        count = 0
        for entry in self._index:
            if not entry.leased:
                break
            entry.leased = False
            count += 1
        return count

    def remove(self, seq: int) -> bool:
        """The record is stored by the broker (or given up on): forget it. False if unknown."""
        self._check_open()
        self._io.apply_finished()
        entry = self._index.get(seq)
        if entry is None:
            return False
        self._remove(entry)
        self._removed += 1
        self._index.trim_rank(entry.rank)
        return True

    # -- lifecycle --------------------------------------------------------------------------------

    def start_background_io(self) -> None:
        """Run fsync and compaction on a worker thread from now on (see the module docstring).
        Call it from the thread that uses the outbox; close() stops the worker."""
        if not self._closed:
            self._io.start()

    def wait_for_background_io(self, timeout: float | None = None) -> bool:
        """Block until the worker has run everything handed to it so far (False on timeout).
        The one call that is safe from any thread: `await asyncio.to_thread(...)` it before close()
        so that close() has next to nothing left to wait for on the event loop."""
        return self._io.wait_idle(timeout)

    def sync(self) -> None:
        """fsync the files written since the last sync (nothing with fsync_interval_s=None), and
        retry disk work that failed (removals acks.log refused, deletions); with background I/O
        this starts the file work and returns."""
        self._io.apply_finished()
        if self._closed:
            return
        active = self._segments.active
        self._housekeeping.sync(self._acks, active.fd if active else None)

    def close(self) -> None:
        """fsync and close; queued records stay on disk for the next Outbox on this directory."""
        if self._closed:
            return
        self._io.stop()  # runs what is queued first; whatever its results queue now runs inline
        self.sync()
        self._closed = True
        self._close_fds()
        if self._acks.unrecorded or self._acks.forgotten:
            log.warning(
                "outbox could not record %d removals in %s; those events are sent again on the next start "
                "(JetStream drops a copy as a duplicate only within its duplicate window)",
                self._acks.unrecorded + self._acks.forgotten,
                ACKS_NAME,
            )
        if self._index:
            log.warning(
                "outbox closed with %d events (%d bytes) left in %s; they are replayed on the next start",
                len(self._index),
                self._index.bytes,
                self.directory,
            )
        else:
            log.info("outbox closed empty dir=%s", self.directory)

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals: removal and bounds ------------------------------------------------------------

    def _remove(self, entry: Entry) -> None:
        self._index.discard(entry)
        self._segments.release(entry.seq, entry.segment)
        # Logged even when the files go next: a deletion can fail, and then acks.log must know.
        if self._acks.log_removal(entry.seq):
            self._housekeeping.dirty = True
        if not self._index:
            self._reset()  # all gone: drop the files
            return
        self._segments.mark_dead(entry.seq, entry.segment)
        self._compactor.maybe_compact(self._segments, self._index, self._acks)
        self._maybe_sync()

    def _reset(self) -> None:
        # Segments go first: a crash in between leaves acks for records that no longer exist
        # (harmless), never records without their acks (re-sent).
        self._segments.delete_all()
        self._index.clear_ranks()
        self._compactor.empty_acks(self._acks)

    def _enforce_bounds(self) -> None:
        while self._index.over_bounds():
            victim = self._index.pick_victim()
            if victim is None:
                return  # the rest is in flight; the bound is exceeded by at most that window
            self._index.count_drop(victim)
            self._remove(victim)
            self._index.log_drop()

    def _maybe_sync(self) -> None:
        if self._housekeeping.sync_due:
            self.sync()

    # -- internals: open and close ----------------------------------------------------------------

    def _load(self) -> None:
        for stale in self.directory.glob("*.tmp"):  # a compaction interrupted by a crash
            with contextlib.suppress(OSError):  # harmless if it stays: the next one truncates it
                stale.unlink(missing_ok=True)
        found, corrupt = self._segments.scan()
        self._corrupt += corrupt
        removed, corrupt = self._acks.read()
        self._corrupt += corrupt
        for record in self._segments.recover(found, removed):
            self._index.add(Entry.found(record))
        self._next_seq = max([*found, *removed, 0]) + 1
        self._recovered = len(self._index)
        self._segments.delete_empty()

    def _check_open(self) -> None:
        if self._closed:
            raise OutboxClosedError(f"outbox {self.directory} is closed")

    def _close_fds(self) -> None:
        self._segments.close_all()
        self._acks.close()
        if self._lock_fd is not None:
            close_quietly(self._lock_fd)  # closing the lock fd releases the flock
        self._lock_fd = None


# -- the directory lock ---------------------------------------------------------------------------


def _lock(directory: Path) -> int:
    fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise OutboxLockedError(f"outbox directory {directory} is in use by another publisher") from None
    return fd
