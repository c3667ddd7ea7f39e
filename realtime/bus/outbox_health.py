"""DiskHealth: which kinds of outbox file work fail right now, and how often each has failed.

A full disk or a read-only directory fails every record the same way; the log gets one line when
a kind of work starts failing and one when it works again, and the rest is counted (the metric
`vidsentry_outbox_disk_errors_total{op}`). The outbox is `writable` while no kind is failing.
Kinds: `append` (a record, or a new segment), `remove` (a removal in acks.log), `delete` (a file
no longer needed), `compact` (merging segments, rewriting acks.log), `fsync`.

Thread-safe: the outbox's own thread and its disk worker both report here.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

log = logging.getLogger(__name__)

OPS = ("append", "remove", "delete", "compact", "fsync")


class DiskHealth:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._failing: dict[str, str] = {}  # op -> the error that started it

    def failed(self, op: str, error: BaseException) -> None:
        with self._lock:
            self._counts[op] = self._counts.get(op, 0) + 1
            first = op not in self._failing
            if first:
                self._failing[op] = str(error)
        if first:
            log.warning(
                "outbox cannot %s in %s: %s; further failures are counted, not logged, until it works again",
                op,
                self.directory,
                error,
            )

    def ok(self, op: str) -> None:
        if op not in self._failing:  # the common case, without the lock (a dict lookup is atomic)
            return
        with self._lock:
            error = self._failing.pop(op, None)
        if error is not None:
            log.info("outbox can %s again in %s", op, self.directory)

    def failing(self, op: str) -> bool:
        return op in self._failing

    @property
    def writable(self) -> bool:
        return not self._failing

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())
