"""RecordIndex: the outbox's records in memory, in replay order, and what goes first when it is full.

Every queued record has an `Entry`: where it sits on disk (segment, offset, size), what the drop
policy needs (kind and rank) and whether take() has leased it. The index keeps them in sequence
order, which is replay order whatever file a record sits in, and the bytes they take on disk. It is
the last step of the write path (codec → segments → index): an entry points at its segment, and no
segment points back at an entry.

Drop policy: past `max_events` or `max_bytes` (leased records count too) the oldest record of the
lowest rank goes: other kinds first (rank 0), then info (1), warning (2, also an alert of unknown
severity) and critical (3) alerts. A leased record is never dropped (it is being sent): when only
leased ones are left the bounds are exceeded by at most the in-flight window. Each rank keeps its
sequence numbers in a deque that is cleaned lazily (a removed record leaves its number behind until
a drop or a removal at the front walks past it). Drops are counted by kind and logged at most once
every 10 seconds.

The index lives on the outbox's thread only; background file work never touches it.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass

from pipelines.events import EventKind
from realtime.bus.outbox_codec import SEVERITY_CODE
from realtime.bus.outbox_segments import Found, Segment

log = logging.getLogger("realtime.bus.outbox")  # the outbox's log, under the name it always had

SEVERITIES = ("info", "warning", "critical")

_ALERT_RANK_UNKNOWN = 2  # an alert without a known severity is kept like a warning
_DROP_LOG_INTERVAL_S = 10.0


def drop_rank(kind: str, severity: str | None) -> int:
    """0 for non-alert kinds, then 1 info, 2 warning (or unknown), 3 critical alerts."""
    if kind != EventKind.ALERTS.value:
        return 0
    return SEVERITY_CODE.get(severity or "", _ALERT_RANK_UNKNOWN)


@dataclass(slots=True, eq=False)
class Entry:
    seq: int
    segment: Segment
    offset: int
    size: int
    kind: str
    rank: int  # drop order: 0 first
    enqueued_at: float
    leased: bool = False  # handed out by take() and not yet removed or requeued

    @classmethod
    def found(cls, record: Found) -> Entry:
        """The entry of a record found on disk at open."""
        rank = drop_rank(record.kind, record.severity)
        return cls(record.seq, record.segment, record.offset, record.size, record.kind, rank, record.enqueued_at)


class RecordIndex:
    """The queued records by sequence number, their bytes, and the drop order; see the module
    docstring."""

    def __init__(self, *, max_events: int, max_bytes: int) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.bytes = 0  # the records' size on disk, framing included
        self._live: OrderedDict[int, Entry] = OrderedDict()  # seq order == replay order
        self._ranks: tuple[deque[int], ...] = tuple(deque() for _ in range(4))  # seqs per drop rank, lazy
        self._dropped: dict[str, int] = {}
        self._last_drop_log = float("-inf")

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Entry]:
        """The records in sequence (replay) order; the leased ones are a prefix."""
        return iter(self._live.values())

    def get(self, seq: int) -> Entry | None:
        return self._live.get(seq)

    def __getitem__(self, seq: int) -> Entry:
        return self._live[seq]

    def oldest(self) -> Entry | None:
        return next(iter(self._live.values()), None)

    @property
    def dropped(self) -> dict[str, int]:
        return dict(self._dropped)

    def add(self, entry: Entry) -> None:
        """A record appended (or found on disk at open), after every record already indexed."""
        self._live[entry.seq] = entry
        self._ranks[entry.rank].append(entry.seq)
        self.bytes += entry.size

    def discard(self, entry: Entry) -> None:
        del self._live[entry.seq]
        self.bytes -= entry.size

    def trim_rank(self, rank: int) -> None:
        """Forget the removed records at the front of a rank's deque."""
        ranked = self._ranks[rank]
        while ranked and ranked[0] not in self._live:
            ranked.popleft()

    def clear_ranks(self) -> None:
        for ranked in self._ranks:
            ranked.clear()

    # -- the drop policy --------------------------------------------------------------------------

    def over_bounds(self) -> bool:
        return len(self._live) > self.max_events or self.bytes > self.max_bytes

    def pick_victim(self) -> Entry | None:
        """The oldest record of the lowest rank not leased (taken off its rank), or None."""
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

    def count_drop(self, entry: Entry) -> None:
        self._dropped[entry.kind] = self._dropped.get(entry.kind, 0) + 1

    def log_drop(self) -> None:
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
