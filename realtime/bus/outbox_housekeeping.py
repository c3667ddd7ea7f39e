"""Housekeeping: the outbox's fsync on an interval, and retrying the file work the disk refused.

Appends and removals are written to the OS at once; fsync() is what makes them survive a power
cut, and it is slow, so it runs at most every `fsync_interval_s` (never with None): the outbox marks
itself `dirty` on every write, and `sync()` (the publisher calls it every second, the outbox itself
after a write once the interval has passed) fsyncs the active segment and acks.log as file work.

When some kind of file work fails (`DiskHealth` is not writable), `sync()` also retries it: the
removals acks.log refused are written at once (they are the source of truth for what left), and
one job at a time, as file work, deletes the files that could not be deleted, probes a directory
that refused new files or compactions, and fsyncs again if fsync failed.

Like compaction, housekeeping is a pass: the outbox hands `sync()` acks.log and the active
segment's descriptor; it holds neither.
"""

from __future__ import annotations

import os
import time
from functools import partial

from realtime.bus.outbox_acks import AcksLog
from realtime.bus.outbox_health import DiskHealth
from realtime.bus.outbox_io import Commit, FileWork


class Housekeeping:
    """When to fsync, and the fsync and retry jobs; see the module docstring. Lives on the
    outbox's thread; its jobs read only descriptors."""

    def __init__(self, io: FileWork, health: DiskHealth, *, fsync_interval_s: float | None) -> None:
        self.fsync_interval_s = fsync_interval_s
        self.dirty = False  # written since the last sync()
        self._io = io
        self._health = health
        self._last_sync = time.monotonic()
        self._retry_queued = False  # a retry of failed file work is queued

    @property
    def needs_sync(self) -> bool:
        """sync() has work: written since the last fsync (and fsync is on), or disk work that
        failed waits for a retry."""
        return (self.dirty and self.fsync_interval_s is not None) or not self._health.writable

    @property
    def sync_due(self) -> bool:
        interval = self.fsync_interval_s
        return interval is not None and self.dirty and time.monotonic() - self._last_sync >= interval

    def sync(self, acks: AcksLog, segment_fd: int | None) -> None:
        """Retry failed disk work, and start the fsync of what was written since the last one
        (acks.log and the active segment, `segment_fd`)."""
        if not self._health.writable:
            self._retry_failed_work(acks, segment_fd)
        if not self.dirty or self.fsync_interval_s is None:
            return
        self.dirty = False
        self._last_sync = time.monotonic()
        self._io.run(partial(self._sync_files, acks, segment_fd))

    def _sync_files(self, acks: AcksLog, segment_fd: int | None) -> None:
        # File work; acks.log's descriptor is read here: only file work replaces it.
        self._io.retry_deletions()
        for fd in (segment_fd, acks.fd):
            if fd is None:
                continue
            try:
                os.fsync(fd)
            except OSError as exc:
                self._health.failed("fsync", exc)
                return
        self._health.ok("fsync")

    def _retry_failed_work(self, acks: AcksLog, segment_fd: int | None) -> None:
        """Write the removals acks.log refused, then (as file work, one at a time) delete the
        files that could not be deleted, check that the directory takes files again and fsync."""
        if acks.write_pending():
            self.dirty = True
        if self._retry_queued:
            return
        self._retry_queued = True
        self._io.run(partial(self._retry_job, acks, segment_fd))

    def _retry_job(self, acks: AcksLog, segment_fd: int | None) -> Commit:
        # File work.
        self._io.retry_deletions()
        if self._health.failing("append") or self._health.failing("compact"):
            self._io.probe()
        if self._health.failing("fsync"):
            self._sync_files(acks, segment_fd)
        return self._retry_done

    def _retry_done(self) -> None:
        self._retry_queued = False
