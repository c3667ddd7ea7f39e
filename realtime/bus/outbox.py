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
last interval; a removal lost that way only means a re-send, which JetStream drops as a
duplicate by Nats-Msg-Id within its window. `fsync_interval_s=None` never fsyncs: process
crashes are still covered, power cuts are not (for tests and throwaway deployments).

Bounds: `max_events` and `max_bytes` cap what is queued (leased records included). Past them
the oldest record of the lowest rank goes: other kinds first, then info, warning and critical
alerts. Dead bytes are reclaimed by deleting fully removed segments and merging sparse ones, so
the disk holds at most about 2 x max_bytes + 3 segments, in at most 2 x max_bytes / segment_bytes
+ 8 files (each with an open descriptor).

Not thread-safe: call it from one thread (the publisher's event loop).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.events import EventKind
from realtime.bus.delivery import WireMessage
from realtime.bus.outbox_codec import (
    SEQ,
    SEVERITY_CODE,
    OutboxRecord,
    decode,
    decode_head,
    encode,
    frame_at,
    frame_record,
    scan,
)

log = logging.getLogger(__name__)

SEVERITIES = ("info", "warning", "critical")

_ALERT_RANK_UNKNOWN = 2  # an alert without a known severity is kept like a warning
_DROP_LOG_INTERVAL_S = 10.0
_ACKS_NAME = "acks.log"


class OutboxError(OSError):
    """Base class for outbox failures; an OSError, like the file errors it wraps."""


class OutboxLockedError(OutboxError):
    """Another Outbox (in this or another process) has the directory open."""


class OutboxWriteError(OutboxError):
    """The record could not be written (disk full, I/O error); the outbox is unchanged."""


class OutboxClosedError(OutboxError):
    """The outbox was used after close()."""


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
    write_errors: int
    dropped_overflow: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class _Segment:
    path: Path
    fd: int
    size: int = 0  # bytes in the file
    live: int = 0
    live_bytes: int = 0
    dead: set[int] = field(default_factory=set)  # removed seqs still in the file (so listed in acks.log)


@dataclass(slots=True, eq=False)
class _Entry:
    seq: int
    segment: _Segment
    offset: int
    size: int
    kind: str
    rank: int  # drop order: 0 first
    enqueued_at: float
    leased: bool = False  # handed out by take() and not yet removed or requeued


def drop_rank(kind: str, severity: str | None) -> int:
    """0 for non-alert kinds, then 1 info, 2 warning (or unknown), 3 critical alerts."""
    if kind != EventKind.ALERTS.value:
        return 0
    return SEVERITY_CODE.get(severity or "", _ALERT_RANK_UNKNOWN)


class Outbox:
    """Append-only segments plus an in-memory index; see the module docstring."""

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
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or min(4 * 2**20, max(max_bytes // 4, 4096))
        self.fsync_interval_s = fsync_interval_s
        # Scattered survivors (old alerts) could pin one file each: merge past this many files.
        self._max_segments = 2 * -(-max_bytes // self.segment_bytes) + 8

        self._live: OrderedDict[int, _Entry] = OrderedDict()  # seq order == replay order
        self._ranks: tuple[deque[int], ...] = tuple(deque() for _ in range(4))  # seqs per drop rank, lazy
        self._segments: dict[Path, _Segment] = {}
        self._active: _Segment | None = None
        self._bytes = 0
        self._disk_bytes = 0
        self._dead_total = 0  # sum of len(segment.dead)
        self._acks_entries = 0  # frames in acks.log
        self._next_seq = 1
        self._dirty = False
        self._last_sync = time.monotonic()
        self._closed = False
        self._appended = self._removed = self._recovered = self._corrupt = self._write_errors = 0
        self._dropped: dict[str, int] = {}
        self._last_drop_log = float("-inf")

        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock(self.directory)
        try:
            self._load()
            self._acks_fd = os.open(self.directory / _ACKS_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._rewrite_acks()
            self._enforce_bounds()
        except BaseException:
            self._close_fds()
            raise
        log.info(
            "outbox opened dir=%s depth=%d bytes=%d corrupt=%d",
            self.directory,
            self.depth,
            self._bytes,
            self._corrupt,
        )

    # -- metrics ----------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return len(self._live)

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def oldest_age_s(self) -> float:
        if not self._live:
            return 0.0
        oldest = next(iter(self._live.values()))
        return max(0.0, time.time() - oldest.enqueued_at)

    @property
    def dropped_overflow(self) -> dict[str, int]:
        return dict(self._dropped)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def needs_sync(self) -> bool:
        """Written since the last fsync (and fsync is on)."""
        return self._dirty and not self._closed and self.fsync_interval_s is not None

    def stats(self) -> OutboxStats:
        return OutboxStats(
            depth=self.depth,
            bytes=self._bytes,
            disk_bytes=self._disk_bytes,
            segments=len(self._segments),
            oldest_age_s=self.oldest_age_s,
            appended=self._appended,
            removed=self._removed,
            recovered=self._recovered,
            corrupt=self._corrupt,
            write_errors=self._write_errors,
            dropped_overflow=self.dropped_overflow,
        )

    # -- queueing ---------------------------------------------------------------------------------

    def append(self, msg: WireMessage) -> int:
        """Queue one durable message; returns its sequence number. May drop older records (or this
        one) to stay inside the bounds. Raises OutboxWriteError when the disk refuses the write."""
        self._check_open()
        severity = msg.severity if msg.severity in SEVERITY_CODE else None
        seq = self._next_seq
        enqueued_at = time.time()
        frame = frame_record(encode(seq, enqueued_at, msg, severity))
        segment = self._writable_segment(len(frame))
        offset = segment.size
        try:
            _write_all(segment.fd, frame)
        except OSError as exc:
            self._write_errors += 1
            self._undo_write(segment, offset)
            raise OutboxWriteError(exc.errno or errno.EIO, f"outbox append failed: {exc.strerror or exc}") from exc
        self._next_seq += 1
        segment.size += len(frame)
        segment.live += 1
        segment.live_bytes += len(frame)
        self._disk_bytes += len(frame)
        self._bytes += len(frame)
        rank = drop_rank(msg.kind.value, severity)
        self._live[seq] = _Entry(seq, segment, offset, len(frame), msg.kind.value, rank, enqueued_at)
        self._ranks[rank].append(seq)
        self._appended += 1
        self._dirty = True
        self._enforce_bounds()
        self._maybe_sync()
        return seq

    def take(self, limit: int) -> list[OutboxRecord]:
        """Lease the next `limit` records not yet handed out, oldest first. They stay queued until
        remove(seq); requeue() hands them out again from the front."""
        self._check_open()
        out: list[OutboxRecord] = []
        damaged: list[_Entry] = []
        # The leased records are a prefix of _live (taken in order, requeued all at once), so this
        # walks at most the in-flight window before it finds new ones.
        for entry in self._live.values():
            if len(out) >= limit:
                break
            if entry.leased:
                continue
            record = self._read(entry)
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
        for entry in self._live.values():
            if not entry.leased:
                break
            entry.leased = False
            count += 1
        return count

    def remove(self, seq: int) -> bool:
        """The record is stored by the broker (or given up on): forget it. False if unknown."""
        self._check_open()
        entry = self._live.get(seq)
        if entry is None:
            return False
        self._remove(entry)
        self._removed += 1
        ranked = self._ranks[entry.rank]
        while ranked and ranked[0] not in self._live:
            ranked.popleft()
        return True

    # -- lifecycle --------------------------------------------------------------------------------

    def sync(self) -> None:
        """fsync the files written since the last sync (nothing with fsync_interval_s=None)."""
        if not self._dirty or self._closed or self.fsync_interval_s is None:
            return
        for fd in (self._active.fd if self._active else None, self._acks_fd):
            if fd is None:
                continue
            try:
                os.fsync(fd)
            except OSError as exc:
                self._write_errors += 1
                log.warning("outbox fsync failed in %s: %s", self.directory, exc)
        self._dirty = False
        self._last_sync = time.monotonic()

    def close(self) -> None:
        """fsync and close; queued records stay on disk for the next Outbox on this directory."""
        if self._closed:
            return
        self.sync()
        self._closed = True
        self._close_fds()
        if self._live:
            log.warning(
                "outbox closed with %d events (%d bytes) left in %s; they are replayed on the next start",
                len(self._live),
                self._bytes,
                self.directory,
            )
        else:
            log.info("outbox closed empty dir=%s", self.directory)

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals: removal and bounds ------------------------------------------------------------

    def _remove(self, entry: _Entry) -> None:
        del self._live[entry.seq]
        self._bytes -= entry.size
        segment = entry.segment
        segment.live -= 1
        segment.live_bytes -= entry.size
        if not self._live:
            self._reset()  # all gone: drop the files instead of logging the removal
            return
        self._log_removal(entry.seq)
        segment.dead.add(entry.seq)
        self._dead_total += 1
        if segment.live == 0 and segment is not self._active:
            self._delete_segment(segment)
        self._maybe_compact()
        if self._acks_entries > 2 * self._dead_total + 1024:
            self._rewrite_acks()  # most listed removals belong to files that are gone
        self._maybe_sync()

    def _enforce_bounds(self) -> None:
        while len(self._live) > self.max_events or self._bytes > self.max_bytes:
            victim = self._pick_victim()
            if victim is None:
                return  # the rest is in flight; the bound is exceeded by at most that window
            self._dropped[victim.kind] = self._dropped.get(victim.kind, 0) + 1
            self._remove(victim)
            self._log_drop()

    def _pick_victim(self) -> _Entry | None:
        for ranked in self._ranks:
            index = 0
            while index < len(ranked):
                entry = self._live.get(ranked[index])
                if entry is None:  # removed already: clean the lazy index as we go
                    del ranked[index]
                    continue
                if entry.leased:
                    index += 1
                    continue
                del ranked[index]
                return entry
        return None

    def _log_drop(self) -> None:
        now = time.monotonic()
        if now - self._last_drop_log < _DROP_LOG_INTERVAL_S:
            return
        self._last_drop_log = now
        log.warning(
            "outbox full (max_events=%d max_bytes=%d): dropping the oldest low-severity events, dropped so far %s",
            self.max_events,
            self.max_bytes,
            self._dropped,
        )

    # -- internals: files -------------------------------------------------------------------------

    def _writable_segment(self, size: int) -> _Segment:
        active = self._active
        if active is not None and active.size > 0 and active.size + size > self.segment_bytes:
            self._retire_active()
            active = None
        if active is None:
            path = self.directory / f"seg-{self._next_seq:016x}.log"
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except OSError as exc:
                self._write_errors += 1
                reason = f"cannot create outbox segment {path}: {exc.strerror}"
                raise OutboxWriteError(exc.errno or errno.EIO, reason) from exc
            self._fsync_dir()
            active = self._active = self._segments[path] = _Segment(path, fd)
        return active

    def _retire_active(self) -> None:
        active, self._active = self._active, None
        if active is None:
            return
        self._fsync(active.fd)
        if active.live == 0:
            self._delete_segment(active)

    def _undo_write(self, segment: _Segment, offset: int) -> None:
        try:
            os.ftruncate(segment.fd, offset)
        except OSError:
            # Cannot cut the partial record off: stop appending here; reopening skips the tail.
            with contextlib.suppress(OSError):
                grown = os.fstat(segment.fd).st_size - segment.size
                segment.size += grown
                self._disk_bytes += grown
            self._retire_active()

    def _delete_segment(self, segment: _Segment) -> None:
        self._segments.pop(segment.path, None)
        if segment is self._active:
            self._active = None
        self._disk_bytes -= segment.size
        self._dead_total -= len(segment.dead)
        with contextlib.suppress(OSError):
            os.close(segment.fd)
        segment.path.unlink(missing_ok=True)

    def _reset(self) -> None:
        # Segments go first: a crash in between leaves acks for records that no longer exist
        # (harmless), never records without their acks (re-sent).
        for segment in list(self._segments.values()):
            self._delete_segment(segment)
        self._dead_total = 0
        for ranked in self._ranks:
            ranked.clear()
        self._truncate_acks()

    def _maybe_compact(self) -> None:
        too_much_dead = self._disk_bytes - self._bytes > self._bytes + 2 * self.segment_bytes
        too_many_files = len(self._segments) > self._max_segments
        if not (too_much_dead or too_many_files):
            return
        group = self._pick_merge(by_files=too_many_files)
        if group:
            self._merge(group)

    def _pick_merge(self, *, by_files: bool) -> list[_Segment]:
        """The run of adjacent old segments, at most one segment of live data together, whose
        merge frees the most: files when there are too many, else dead bytes."""
        old = sorted((s for s in self._segments.values() if s is not self._active), key=lambda s: s.path.name)
        best: list[_Segment] = []
        best_gain = 0
        for start in range(len(old)):
            group: list[_Segment] = []
            live = 0
            for segment in old[start:]:
                if group and live + segment.live_bytes > self.segment_bytes:
                    break
                group.append(segment)
                live += segment.live_bytes
            gain = len(group) - 1 if by_files else sum(s.size for s in group) - live
            if gain > best_gain:
                best, best_gain = group, gain
        return best

    def _merge(self, group: list[_Segment]) -> None:
        """Copy the live records of `group` into one file that replaces the first (atomic
        rename), then delete the rest. A crash in between leaves records in two files; reopening
        keeps the first copy."""
        members = set(map(id, group))
        entries = [e for e in self._live.values() if id(e.segment) in members]
        target = group[0]
        tmp = target.path.with_name(target.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            offsets: list[int] = []
            size = 0
            try:
                for entry in entries:
                    _write_all(fd, os.pread(entry.segment.fd, entry.size, entry.offset))
                    offsets.append(size)
                    size += entry.size
                self._fsync(fd)
            except BaseException:
                os.close(fd)
                raise
            os.replace(tmp, target.path)
            self._fsync_dir()
        except OSError as exc:
            self._write_errors += 1
            tmp.unlink(missing_ok=True)
            log.warning("outbox compaction of %s failed, keeping it as is: %s", target.path.name, exc)
            return
        for segment in group[1:]:
            segment.live = 0
            self._delete_segment(segment)
        os.close(target.fd)
        self._disk_bytes += size - target.size
        self._dead_total -= len(target.dead)
        target.fd, target.size, target.dead = fd, size, set()
        target.live, target.live_bytes = len(entries), size
        for entry, offset in zip(entries, offsets, strict=True):
            entry.segment, entry.offset = target, offset

    def _log_removal(self, seq: int) -> None:
        try:
            _write_all(self._acks_fd, frame_record(SEQ.pack(seq)))
        except OSError as exc:
            # Removed in memory anyway; after a restart the record is re-sent (a JetStream duplicate).
            self._write_errors += 1
            log.warning("outbox could not record a removal: %s", exc)
            return
        self._acks_entries += 1
        self._dirty = True

    def _rewrite_acks(self) -> None:
        """Keep only the removals that still matter: those of records still in some file."""
        dead = sorted(seq for segment in self._segments.values() for seq in segment.dead)
        path = self.directory / _ACKS_NAME
        tmp = path.with_name(_ACKS_NAME + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                for start in range(0, len(dead), 4096):
                    chunk = dead[start : start + 4096]
                    fh.write(frame_record(struct.pack(f"<{len(chunk)}Q", *chunk)))
                fh.flush()
                self._fsync(fh.fileno())
            os.replace(tmp, path)
            self._fsync_dir()
            new_fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            self._write_errors += 1
            tmp.unlink(missing_ok=True)
            log.warning("outbox could not compact %s: %s", _ACKS_NAME, exc)
            return
        os.close(self._acks_fd)
        self._acks_fd = new_fd
        self._acks_entries = (len(dead) + 4095) // 4096

    def _truncate_acks(self) -> None:
        try:
            os.ftruncate(self._acks_fd, 0)
        except OSError as exc:
            self._write_errors += 1
            log.warning("outbox could not truncate %s: %s", _ACKS_NAME, exc)
            return
        self._acks_entries = 0
        self._dirty = True

    def _fsync(self, fd: int) -> None:
        if self.fsync_interval_s is not None:
            with contextlib.suppress(OSError):  # a later sync() reports a failing disk
                os.fsync(fd)

    def _fsync_dir(self) -> None:
        # Makes a created, renamed or deleted name durable; best effort (not every filesystem can).
        if self.fsync_interval_s is None:
            return
        with contextlib.suppress(OSError):
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _maybe_sync(self) -> None:
        interval = self.fsync_interval_s
        if interval is not None and self._dirty and time.monotonic() - self._last_sync >= interval:
            self.sync()

    def _read(self, entry: _Entry) -> OutboxRecord | None:
        try:
            data = os.pread(entry.segment.fd, entry.size, entry.offset)
        except OSError:
            return None
        body = frame_at(data, 0)
        record = decode(body) if body is not None else None
        return record if record is not None and record.seq == entry.seq else None

    def _check_open(self) -> None:
        if self._closed:
            raise OutboxClosedError(f"outbox {self.directory} is closed")

    def _close_fds(self) -> None:
        for segment in self._segments.values():
            with contextlib.suppress(OSError):
                os.close(segment.fd)
        self._segments.clear()
        self._active = None
        for name in ("_acks_fd", "_lock_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)  # closing the lock fd releases the flock
                setattr(self, name, None)

    # -- internals: recovery ----------------------------------------------------------------------

    def _load(self) -> None:
        for stale in self.directory.glob("*.tmp"):  # a compaction interrupted by a crash
            stale.unlink(missing_ok=True)
        found: dict[int, _Entry] = {}
        for path in sorted(self.directory.glob("seg-*.log")):
            data = path.read_bytes()
            segment = self._segments[path] = _Segment(path, os.open(path, os.O_RDONLY), len(data))
            self._disk_bytes += len(data)
            for offset, size, body in scan(data):
                head = decode_head(body) if body is not None else None
                if head is not None and head[0] in found:
                    continue  # a second copy left by a merge cut short; the first one counts
                if head is None:
                    self._corrupt += 1
                    log.warning("outbox %s: skipped %d damaged bytes at offset %d", path.name, size, offset)
                    continue
                seq, enqueued_at, kind, severity = head
                rank = drop_rank(kind, severity)
                found[seq] = _Entry(seq, segment, offset, size, kind, rank, enqueued_at)
        removed = self._read_acks()
        for seq in sorted(found):
            entry = found[seq]
            if seq in removed:
                entry.segment.dead.add(seq)
                self._dead_total += 1
                continue
            self._live[seq] = entry
            self._ranks[entry.rank].append(seq)
            self._bytes += entry.size
            entry.segment.live += 1
            entry.segment.live_bytes += entry.size
        self._next_seq = max([*found, *removed, 0]) + 1
        self._recovered = len(self._live)
        for segment in list(self._segments.values()):
            if segment.live == 0:
                self._delete_segment(segment)

    def _read_acks(self) -> set[int]:
        path = self.directory / _ACKS_NAME
        if not path.exists():
            return set()
        removed: set[int] = set()
        for offset, size, body in scan(path.read_bytes()):
            if body is None or len(body) % SEQ.size:
                self._corrupt += 1
                log.warning("outbox %s: skipped %d damaged bytes at offset %d", _ACKS_NAME, size, offset)
                continue
            removed.update(struct.unpack(f"<{len(body) // SEQ.size}Q", body))
        return removed


# -- small OS helpers -----------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError("short write")
        view = view[written:]


def _lock(directory: Path) -> int:
    fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise OutboxLockedError(f"outbox directory {directory} is in use by another publisher") from None
    return fd
