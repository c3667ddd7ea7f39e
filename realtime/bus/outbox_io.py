"""Where the outbox's slow file work runs: inline, or on one background thread, in order.

fsync, segment merges and acks-log rewrites can take tens of milliseconds; run on the event loop
they stall every stream at once. `FileWork` is the outbox's one way to run such work: inline in
the calling thread (the default), or, after `start()`, on a `DiskWorker`. A job is a callable run
on the worker thread; it may return a *commit*, a callable that must run on the outbox's own
thread (it touches the in-memory index), which the outbox picks up with `apply_finished()` at its
next call. Jobs run one at a time, first in first out, so a job may rely on every earlier one
having finished (a file is closed or deleted only after the jobs that use it).

The DiskWorker's queue is bounded: a disk so slow that `max_queued` jobs pile up makes `submit`
wait, which slows the producer down instead of growing memory without limit.

`FileWork` also holds the file work that more than one part of the outbox needs (fsync, fsync of
the directory, deleting a file and retrying the deletions that failed, probing a failing
directory); those run as jobs, on the worker thread or inline, never on their own.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from realtime.bus.outbox_health import DiskHealth

log = logging.getLogger(__name__)

Commit = Callable[[], None]
Job = Callable[[], Commit | None]

_PROBE_NAME = "probe.tmp"


class DiskWorker:
    """One thread that runs jobs in the order they are handed over; see the module docstring."""

    def __init__(self, name: str, max_queued: int = 1024) -> None:
        self.name = name
        self.max_queued = max_queued
        self._queue: deque[Job] = deque()  # the head is the job running, until it is done
        self._finished: deque[Commit] = deque()  # appended here, popped by the owner: thread-safe
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError(f"{self.name} is stopped")
            while len(self._queue) >= self.max_queued:
                self._cond.wait()
            self._queue.append(job)
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    @property
    def has_finished(self) -> bool:
        return bool(self._finished)

    def take_finished(self) -> list[Commit]:
        """The commits of the jobs finished so far, in order; the caller runs them."""
        commits: list[Commit] = []
        while self._finished:
            commits.append(self._finished.popleft())
        return commits

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every job handed over so far has run (False on timeout). Thread-safe."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue, timeout)

    def stop(self) -> None:
        """Run what is queued, then end the thread (waits for it)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopping)
                if not self._queue:
                    return
                job = self._queue[0]
            try:
                commit = job()
            except Exception:  # jobs handle OSError themselves; this is a bug, keep going
                log.exception("%s: background job failed", self.name)
                commit = None
            if commit is not None:
                self._finished.append(commit)
            with self._cond:
                self._queue.popleft()
                self._cond.notify_all()


class FileWork:
    """Runs an outbox's file work inline, or on a DiskWorker once `start()`ed; see the module
    docstring. `run`, `apply_finished`, `start`, `stop` belong to the outbox's thread; the rest is
    file work (a job, or called from one)."""

    def __init__(self, directory: Path, health: DiskHealth, *, fsync: bool) -> None:
        self.directory = directory
        self.fsync_enabled = fsync  # False: fsync_interval_s=None, nothing is ever fsynced
        self._health = health
        self._worker: DiskWorker | None = None  # None: file work runs inline
        self._undeleted: list[Path] = []  # file work only: files whose deletion failed, retried later

    # -- the outbox's thread ----------------------------------------------------------------------

    @property
    def background(self) -> bool:
        return self._worker is not None

    def start(self) -> None:
        if self._worker is None:
            self._worker = DiskWorker(f"outbox-io {self.directory.name}")

    def run(self, job: Job) -> None:
        """Run slow file work on the worker thread, or inline without one."""
        worker = self._worker
        if worker is not None:
            worker.submit(job)
            return
        commit = job()
        if commit is not None:
            commit()

    def apply_finished(self) -> None:
        worker = self._worker
        if worker is not None and worker.has_finished:
            for commit in worker.take_finished():
                commit()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the worker has run everything handed to it so far (False on timeout); True
        at once without one. Thread-safe."""
        worker = self._worker
        return worker.wait_idle(timeout) if worker is not None else True

    def stop(self) -> None:
        """Run what is queued and end the worker; then apply its results, and whatever they queue
        runs inline from now on."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()  # runs what is queued first
            for commit in worker.take_finished():
                commit()  # whatever they queue now runs inline

    # -- file work --------------------------------------------------------------------------------

    def fsync(self, fd: int) -> None:
        if self.fsync_enabled:
            with contextlib.suppress(OSError):  # a later sync() reports a failing disk
                os.fsync(fd)

    def fsync_dir(self) -> None:
        # Makes a created, renamed or deleted name durable; best effort (not every filesystem can).
        if not self.fsync_enabled:
            return
        with contextlib.suppress(OSError):
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def delete_file(self, fd: int, path: Path) -> None:
        # A file that cannot be deleted is retried later (see retry_deletions).
        close_quietly(fd)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            self._undeleted.append(path)
            self._health.failed("delete", exc)

    def retry_deletions(self) -> bool:
        """Delete the files whose deletion failed; True when none is left."""
        if not self._undeleted:
            return True
        left: list[Path] = []
        for path in self._undeleted:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                left.append(path)
        self._undeleted = left
        if left:
            return False
        self._health.ok("delete")
        return True

    def probe(self) -> None:
        """Can the directory take a new file and a page of data again?"""
        path = self.directory / _PROBE_NAME
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                write_all(fd, bytes(4096))
            finally:
                os.close(fd)
            path.unlink()
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            return
        self._health.ok("append")
        self._health.ok("compact")


# -- small OS helpers -----------------------------------------------------------------------------


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError("short write")
        view = view[written:]


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def required(fd: int | None) -> int:
    if fd is None:
        raise OSError(errno.EBADF, "outbox file is closed")
    return fd
