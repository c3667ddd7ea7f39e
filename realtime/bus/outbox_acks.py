"""AcksLog: acks.log, the outbox's record of which records left it (acked or dropped).

A record is never rewritten in place: its removal is a frame appended here (the outbox's framing,
see `outbox_codec`, around packed little-endian u64 sequence numbers, up to 4096 a frame), one
write() to the OS before remove() returns. On open the outbox reads this file back and replays
what it does not list. So acks.log is the source of truth for what left:

- a removal it refuses (full disk, I/O error) is kept in memory and written with the next one
  (or by `write_pending()`, which the outbox's sync() and close() call), so a record acked in this
  process is never replayed by it; at most max(max_events, 4096) are kept, past that the oldest
  goes and is counted as forgotten (a re-send, which JetStream drops as a duplicate only within
  its window); a torn frame is cut off again;
- it only grows, so it is rewritten to the removals that still matter (those of records still in
  some segment file; none after a reset): a new file, fsynced, renamed over it. What to rewrite,
  and when, is the compaction pass's decision (`outbox_compaction`): it starts a rewrite here on
  the outbox's thread and runs `replace()` as file work (on the worker thread, or inline); a
  removal logged in between also goes into the new file, under a lock held only while the new file
  takes over. A rewrite waits while a file that should be gone is still there: acks.log must go on
  listing its records' removals.

Besides FileWork and DiskHealth (below every part), AcksLog holds only its file and the removals
it refused; it calls nothing above it.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import struct
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from realtime.bus.outbox_codec import SEQ, frame_record, scan
from realtime.bus.outbox_health import DiskHealth
from realtime.bus.outbox_io import FileWork, close_quietly, required, write_all

log = logging.getLogger("realtime.bus.outbox")  # the outbox's log, under the name it always had

ACKS_NAME = "acks.log"
_ACKS_PER_FRAME = 4096
_MIN_UNRECORDED_CAP = 4096  # removals kept in memory while acks.log refuses them: at least this many


@dataclass(slots=True, eq=False)
class Rewrite:
    """acks.log rewritten to `seqs`, plus the removals logged while the rewrite runs (`tail`)."""

    seqs: list[int]
    tail: list[int] = field(default_factory=list)


class AcksLog:
    """acks.log: append removals, keep the ones it refuses, rewrite it; see the module docstring.

    The outbox's thread appends; the rewrite is file work. Shared between the two, under the lock:
    which descriptor removals go to, its size and frame count, and the rewrites under way."""

    def __init__(self, directory: Path, io: FileWork, health: DiskHealth, *, max_events: int) -> None:
        self.path = directory / ACKS_NAME
        self._io = io
        self._health = health
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._entries = 0  # frames in the file: what a rewrite would shrink
        self._size = 0  # bytes in the file, to cut a torn removal off again
        self._rewrites: list[Rewrite] = []
        # Removals acks.log refused, written with the next one; bounded, what goes is counted.
        self._unrecorded: set[int] = set()
        self._unrecorded_cap = max(max_events, _MIN_UNRECORDED_CAP)
        self.forgotten = 0

    @property
    def fd(self) -> int | None:
        """The descriptor removals go to; only file work replaces it (so file work may read it)."""
        return self._fd

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def unrecorded(self) -> int:
        """Removals refused so far and kept in memory, to write later."""
        return len(self._unrecorded)

    # -- open and close ---------------------------------------------------------------------------

    def read(self) -> tuple[set[int], int]:
        """Recovery: the removals the file lists, and how many damaged stretches were skipped."""
        if not self.path.exists():
            return set(), 0
        removed: set[int] = set()
        corrupt = 0
        for offset, size, body in scan(self.path.read_bytes()):
            if body is None or len(body) % SEQ.size:
                corrupt += 1
                log.warning("outbox %s: skipped %d damaged bytes at offset %d", ACKS_NAME, size, offset)
                continue
            removed.update(struct.unpack(f"<{len(body) // SEQ.size}Q", body))
        return removed, corrupt

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd is not None:
            close_quietly(self._fd)
        self._fd = None

    # -- removals ---------------------------------------------------------------------------------

    def log_removal(self, seq: int) -> bool:
        """Append one removal (after those refused before, if any); True when acks.log took it
        (there is something to fsync), False when it is kept in memory instead."""
        if not self._unrecorded:
            if self._write([seq]):
                return True
            self._keep_unrecorded(seq)
            return False
        # acks.log has refused removals: this one goes with them.
        self._keep_unrecorded(seq)
        return self.write_pending()

    def write_pending(self) -> bool:
        """Write every removal acks.log refused before; True when it took them now."""
        if not self._unrecorded:
            return False
        if not self._write(sorted(self._unrecorded)):
            return False
        self._unrecorded.clear()
        return True

    def _keep_unrecorded(self, seq: int) -> None:
        self._unrecorded.add(seq)
        if len(self._unrecorded) > self._unrecorded_cap:
            self._unrecorded.discard(min(self._unrecorded))  # the oldest: the likeliest to be a duplicate
            self.forgotten += 1

    def _write(self, seqs: list[int]) -> bool:
        """Append `seqs`; False if acks.log refuses them (DiskHealth hears of it; a torn frame is
        cut off again)."""
        with self._lock:
            fd = self._fd
            try:
                written = _write_seqs(required(fd), seqs)
            except OSError as exc:
                failure: OSError | None = exc
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, self._size)
            else:
                failure = None
                self._size += written
                self._entries += _frames(len(seqs))
                for rewrite in self._rewrites:
                    rewrite.tail.extend(seqs)
        if failure is not None:
            self._health.failed("remove", failure)
            return False
        self._health.ok("remove")
        return True

    # -- the rewrite ------------------------------------------------------------------------------

    def start_rewrite(self, seqs: list[int]) -> Rewrite:
        """On the outbox's thread: acks.log is to become `seqs`; every removal logged from now on
        goes into the new file too. Hand the result to `replace()`, as file work."""
        rewrite = Rewrite(seqs)
        with self._lock:
            self._rewrites.append(rewrite)
        return rewrite

    def replace(self, rewrite: Rewrite) -> bool:
        """File work: write the new file and put it in place of acks.log; False when it failed or
        had to wait for a file that could not be deleted (acks.log is then as it was)."""
        # The new file gets the seqs, then (under the lock, so no removal slips between) the
        # removals logged meanwhile, and replaces acks.log.
        if not self._io.retry_deletions():
            # A file that should be gone is still there: acks.log must go on listing the removals
            # of its records, so it is not rewritten until the file is gone.
            self._forget(rewrite)
            return False
        path = self.path
        tmp = path.with_name(ACKS_NAME + ".tmp")
        fd: int | None = None
        old_fd: int | None = None
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            size = _write_seqs(fd, rewrite.seqs)
            self._io.fsync(fd)
            with self._lock:
                size += _write_seqs(fd, rewrite.tail)
                os.replace(tmp, path)
                self._rewrites.remove(rewrite)
                old_fd, self._fd, self._size = self._fd, fd, size
                self._entries = _frames(len(rewrite.seqs)) + _frames(len(rewrite.tail))
        except OSError as exc:
            self._forget(rewrite)
            if fd is not None:
                close_quietly(fd)
            with contextlib.suppress(OSError):  # a read-only directory refuses this too
                tmp.unlink(missing_ok=True)
            self._health.failed("compact", exc)
            return False
        self._health.ok("compact")
        self._io.fsync_dir()
        if old_fd is not None:
            close_quietly(old_fd)
        return True

    def _forget(self, rewrite: Rewrite) -> None:
        with self._lock:
            if rewrite in self._rewrites:
                self._rewrites.remove(rewrite)


def _frames(count: int) -> int:
    return -(-count // _ACKS_PER_FRAME)


def _write_seqs(fd: int, seqs: list[int]) -> int:
    """Write frames of packed little-endian u64 sequence numbers; returns how many bytes."""
    if len(seqs) == 1:  # one removal: the common case
        frames = frame_record(SEQ.pack(seqs[0]))
    else:
        packed = array.array("Q", seqs)
        if sys.byteorder == "big":
            packed.byteswap()
        data = memoryview(packed).cast("B")
        step = _ACKS_PER_FRAME * SEQ.size
        frames = b"".join(frame_record(bytes(data[start : start + step])) for start in range(0, len(data), step))
    if frames:
        write_all(fd, frames)
    return len(frames)
