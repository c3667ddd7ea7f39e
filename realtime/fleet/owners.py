"""Who holds what, as this worker reads the lease bucket: each stream's owner and each live
worker's node record.

The lease bucket's mirror is updated by its watch and by this worker's own writes; a key that
has not been seen again for a TTL and a renewal is treated as gone (an expiry marker may be
missed). This worker's own leases come from its keeper, which knows them first; a lease in this
worker's name that the keeper does not hold is a previous run's, shown as such until it expires.
Lease records are decoded once per revision: renewals rewrite them every interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from realtime.fleet.mirror import KvMirror
from realtime.leases.keeper import LeaseKeeper
from realtime.leases.records import LEASE_PREFIX, NODE_PREFIX, LeaseRecord, NodeRecord


class LeaseReader:
    def __init__(self, node: str, mirror: Callable[[], KvMirror | None], keeper: Callable[[], LeaseKeeper | None],
                 stale_after: Callable[[], float]) -> None:
        self.node = node
        self._mirror = mirror  # the worker opens the bucket and its keeper when it joins
        self._keeper = keeper
        self.stale_after = stale_after
        self._lease_owners: dict[str, tuple[int, str | None]] = {}  # lease key -> (revision, node), as in the mirror

    def owners(self) -> dict[str, str]:
        """stream id -> the worker holding its lease (this worker's own from its keeper)."""
        owners: dict[str, str] = {}
        leases, keeper = self._mirror(), self._keeper()
        if leases is None or keeper is None:
            return owners
        now, stale = time.monotonic(), self.stale_after()
        for key, seen in leases.items(LEASE_PREFIX):
            node = self.owner_of(key, seen.revision, seen.value)
            if node is None or now - seen.seen_at > stale:
                continue
            # A lease in this worker's name it does not hold is a previous run's: held until it expires.
            owners[key[len(LEASE_PREFIX):]] = node if node != self.node else f"{self.node} (previous)"
        for stream_id in keeper.held():
            owners[stream_id] = self.node
        return owners

    def owner_of(self, key: str, revision: int, value: bytes) -> str | None:
        """The node named in a lease record, decoded once per revision."""
        cached = self._lease_owners.get(key)
        if cached is not None and cached[0] == revision:
            return cached[1]
        record = LeaseRecord.decode(value)
        node = record.node if record is not None else None
        self._lease_owners[key] = (revision, node)
        return node

    def known_owner(self, key: str) -> tuple[int, str | None] | None:
        """The (revision, node) last decoded for a lease key, if any."""
        return self._lease_owners.get(key)

    def forget(self, key: str) -> None:
        self._lease_owners.pop(key, None)

    def node_records(self) -> dict[str, NodeRecord]:
        """The live workers' node records, by node name (this worker's own included)."""
        records: dict[str, NodeRecord] = {}
        leases = self._mirror()
        if leases is None:
            return records
        now, stale = time.monotonic(), self.stale_after()
        for _, seen in leases.items(NODE_PREFIX):
            record = NodeRecord.decode(seen.value)
            if record is not None and now - seen.seen_at <= stale:
                records[record.node] = record
        return records

    def other_nodes(self) -> dict[str, NodeRecord]:
        """The other live workers that take streams (not draining)."""
        return {name: r for name, r in self.node_records().items() if name != self.node and not r.draining}
