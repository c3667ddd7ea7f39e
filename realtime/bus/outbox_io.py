"""DiskWorker: one background thread that runs an outbox's slow file work, in the order handed over.

fsync, segment merges and acks-log rewrites can take tens of milliseconds; run on the event loop
they stall every stream at once. The outbox hands them to a DiskWorker instead. A job is a
callable run on the worker thread; it may return a *commit*, a callable that must run on the
outbox's own thread (it touches the in-memory index), which the outbox picks up with
`take_finished` at its next call. Jobs run one at a time, first in first out, so a job may rely
on every earlier one having finished (a file is closed or deleted only after the jobs that use it).

The queue is bounded: a disk so slow that `max_queued` jobs pile up makes `submit` wait, which
slows the producer down instead of growing memory without limit.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

Commit = Callable[[], None]
Job = Callable[[], Commit | None]


class DiskWorker:
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
