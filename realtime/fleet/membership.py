"""A worker's membership of its fleet: the two buckets and their watches, the lease keeper, and the
node record by which the other workers know this one.

Joining opens both buckets, watches them (realtime.fleet.mirror) and waits until both watches have
replayed them; only then is this worker's view of the fleet worth acting on. The node record says
that this worker is alive, how many streams it takes, whether it is draining, and its streams'
states; it is written every renewal and soon after a stream's state changes. Leaving hands every
lease back and deletes the record, so the other workers take over at once instead of after the
TTL. A reconnect, or a record of this worker's that its own watch never delivered, means the
watches may have lost their consumers: both are started again.

Two workers must never share a node name: each would take the other's leases for a crashed run of
its own. A worker that finds a record of its name in the lease bucket when it joins waits until
that record is rewritten by its owner (then it refuses to start: `DuplicateNode`) or expires or is
deleted (a crashed or stopped run: it joins), at most the lease TTL plus one renewal interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient

from pipelines.tasks import TaskOwner
from realtime.errors import ServiceError
from realtime.fleet.mirror import KvMirror
from realtime.leases.buckets import FleetBuckets, open_buckets
from realtime.leases.keeper import LeaseKeeper
from realtime.leases.options import FleetOptions
from realtime.leases.records import NodeRecord, lease_bucket, node_key

log = logging.getLogger("realtime.fleet.worker")  # the worker's log name: filters on it keep matching

SYNC_TIMEOUT_S = 10.0
STALL_AFTER_RENEWALS = 3  # a node record the worker's own watch has not delivered after this many renewals
STALL_MIN_S = 3.0  # ... and at least this long: the watch is stalled
NATS_ERRORS = (nats.errors.Error, TimeoutError, OSError)


class FleetUnavailable(ServiceError):
    """The fleet's key-value store cannot be reached; nothing changed."""


class DuplicateNode(ServiceError):
    """Another live worker of this fleet runs under this worker's node name."""

    def __init__(self, fleet: str, node: str) -> None:
        super().__init__(
            f"another worker of fleet {fleet!r} is running as node {node!r}: give each worker its own --node"
        )
        self.fleet = fleet
        self.node = node


class Membership:
    def __init__(
        self,
        options: FleetOptions,
        connection: Callable[[], NatsClient | None],
        *,
        on_desired_change: Callable[[str], None],
        on_lease_change: Callable[[str], None],
        on_duplicate: Callable[[], None],
    ) -> None:
        self.options = options
        self.node = options.node
        self._connection = connection
        self._on_desired_change = on_desired_change
        self._on_lease_change = on_lease_change
        self._on_duplicate = on_duplicate  # counts a record of this name written by another instance
        self.buckets: FleetBuckets | None = None
        self.desired_mirror: KvMirror | None = None
        self.lease_mirror: KvMirror | None = None
        self.keeper: LeaseKeeper | None = None
        self.instance = uuid.uuid4().hex  # this run: a node record of this name with another is another worker
        self._duplicate_seen: set[int] = set()  # revisions of such records already logged
        self._joined = False  # past the node-name check: a record of this name by another is a duplicate
        self._reconnects = 0
        self._mirror_tasks: list[asyncio.Task[None]] = []
        self._watches = TaskOwner("fleet membership")  # the two bucket watches; a crash is logged

    # -- joining and leaving ---------------------------------------------------------------

    async def join(self) -> None:
        """Open and watch both buckets, wait until both are read, and check the node name. Whatever
        fails, nothing is left watching; after `DuplicateNode` there is no keeper either."""
        nc = self._connection()
        if nc is None:
            raise FleetUnavailable("not connected to NATS")
        js = nc.jetstream()
        options = self.options
        self.buckets = await open_buckets(js, options.name, lease_ttl_s=options.lease_ttl_s,
                                          replicas=options.replicas)
        self.desired_mirror = KvMirror(self.buckets.desired, on_change=self._on_desired_change)
        self.lease_mirror = leases = KvMirror(self.buckets.leases, on_change=self._lease_changed)
        # Lease writes get a short request timeout: during a leader election a write stalls, and a
        # renewal that waits out nats-py's 5 s default retries too seldom to beat the lease's validity.
        keeper_js = nc.jetstream(timeout=min(5.0, max(1.0, 2 * options.renew_interval_s)))
        keeper_kv = await keeper_js.key_value(lease_bucket(options.name))
        self.keeper = LeaseKeeper(keeper_kv, self.node, self.buckets.lease_ttl_s,
                                  on_write=leases.note, tombstone=leases.tombstone)
        self._reconnects = nc.stats.get("reconnects", 0)
        self._mirror_tasks = [
            self._watches.spawn(self.desired_mirror.run(), "fleet-desired-watch"),
            self._watches.spawn(leases.run(), "fleet-lease-watch"),
        ]
        try:
            async with asyncio.timeout(SYNC_TIMEOUT_S):
                await self.desired_mirror.synced.wait()
                await leases.synced.wait()
            await self._check_node_name()  # before this worker writes anything
        except BaseException as exc:  # not joined (no sync in time, a duplicate, cancelled): watch nothing
            await self.stop_watches()
            if isinstance(exc, DuplicateNode):
                self.keeper = None  # so leaving never deletes the other worker's record
            raise
        self._joined = True

    async def _check_node_name(self) -> None:
        """DuplicateNode if another live worker holds this node name. A record of this name that
        exists now is another process's; it is live if it is rewritten before it expires."""
        leases = self.lease_mirror
        assert leases is not None and self.buckets is not None
        key = node_key(self.node)
        first = leases.get(key)
        if first is None:
            return
        record = NodeRecord.decode(first.value)
        log.info("a record of this node name exists; waiting to see whether its worker is alive",
                 extra={"node": self.node, "instance": record.instance if record is not None else None,
                        "revision": first.revision, "wait_s": round(self.stale_after(), 1)})
        deadline = time.monotonic() + self.stale_after()
        while time.monotonic() < deadline:
            seen = leases.get(key)
            if seen is None:
                return  # expired or deleted: a crashed or stopped run of this node
            if seen.revision != first.revision:
                other = NodeRecord.decode(seen.value)
                if other is None or other.instance != self.instance:
                    log.error("another worker is running under this node name; not joining",
                              extra={"fleet": self.options.name, "node": self.node,
                                     "other_instance": other.instance if other is not None else None})
                    raise DuplicateNode(self.options.name, self.node)
            await asyncio.sleep(0.05)
        # Neither renewed nor expired within a TTL and a renewal (a missed expiry marker): not alive.

    async def leave(self) -> None:
        """Hand every lease back, delete the node record and stop watching (never joined: nothing)."""
        keeper, buckets = self.keeper, self.buckets
        if keeper is None or buckets is None:
            return
        await asyncio.gather(*(keeper.release(sid) for sid in keeper.held()), return_exceptions=True)
        with contextlib.suppress(*NATS_ERRORS, nats.js.errors.KeyValueError):
            await buckets.leases.delete(node_key(self.node))
        await self.stop_watches()
        log.info("fleet left", extra={"fleet": self.options.name, "node": self.node})

    async def stop_watches(self) -> None:
        """Cancel the bucket watches and wait for them to end (none is left behind unawaited)."""
        self._mirror_tasks = []
        await self._watches.cancel_all()

    # -- the node record -------------------------------------------------------------------

    async def publish(self, capacity: int, draining: bool, states: dict[str, str]) -> None:
        buckets, leases = self.buckets, self.lease_mirror
        assert buckets is not None and leases is not None
        record = NodeRecord(self.node, capacity, draining, states, self.instance).encode()
        try:
            revision = await buckets.leases.put(node_key(self.node), record)
        except NATS_ERRORS:
            return  # the next round tries again; others see this worker as gone after the TTL
        leases.note(node_key(self.node), record, revision)
        leases.expect(revision)

    def _lease_changed(self, key: str) -> None:
        if key == node_key(self.node):
            self._other_instance(key)
        self._on_lease_change(key)

    def _other_instance(self, key: str) -> None:
        """Two workers that joined at the same moment both saw no record of their name: the one that
        sees the other's says so (the next start of either refuses)."""
        seen = self.lease_mirror.get(key) if self.lease_mirror is not None else None
        if not self._joined or seen is None or seen.revision in self._duplicate_seen:
            return  # before joining, _check_node_name judges the record (a crashed run's is no duplicate)
        record = NodeRecord.decode(seen.value)
        if record is None or not record.instance or record.instance == self.instance:
            return
        if len(self._duplicate_seen) >= 64:
            self._duplicate_seen.clear()
        self._duplicate_seen.add(seen.revision)
        self._on_duplicate()
        log.error("another worker writes this node's record: two workers share one --node",
                  extra={"fleet": self.options.name, "node": self.node, "other_instance": record.instance,
                         "revision": seen.revision})

    # -- the watches -----------------------------------------------------------------------

    @property
    def watching(self) -> bool:
        """Both buckets read and both watches still running."""
        desired, leases = self.desired_mirror, self.lease_mirror
        if desired is None or leases is None:
            return False
        alive = bool(self._mirror_tasks) and all(not task.done() for task in self._mirror_tasks)
        return alive and desired.synced.is_set() and leases.synced.is_set()

    @property
    def watch_stalls(self) -> int:
        return sum(m.stalls for m in (self.desired_mirror, self.lease_mirror) if m is not None)

    def check_watches(self) -> None:
        """Start both watches again after a reconnect, or when this worker's own write never came back."""
        nc = self._connection()
        if nc is None or self.desired_mirror is None or self.lease_mirror is None:
            return
        reconnects = nc.stats.get("reconnects", 0)
        if reconnects != self._reconnects:
            self._reconnects = reconnects
            self.desired_mirror.restart()
            self.lease_mirror.restart()
        elif self.lease_mirror.overdue(self._stall_after_s()):
            # This worker's node record went out a while ago and its own watch has not seen it: the
            # watch's consumer is gone with a NATS node. The desired watch most likely went with it.
            log.warning("fleet watch stalled; watching again",
                        extra={"fleet": self.options.name, "node": self.node})
            self.desired_mirror.restart(stalled=True)
            self.lease_mirror.restart(stalled=True)

    def _stall_after_s(self) -> float:
        return max(STALL_AFTER_RENEWALS * self.options.renew_interval_s, STALL_MIN_S)

    def stale_after(self) -> float:
        """How long a record not seen again counts as live."""
        keeper = self.keeper
        ttl = keeper.ttl_s if keeper is not None else self.options.lease_ttl_s
        return ttl + self.options.renew_interval_s  # in case an expiry marker was missed
