"""One worker of a fleet: the desired set from KV, the leases it holds, and the local registry
kept to exactly the streams it holds.

Two loops: renewal (every `renew_interval_s`: renew every lease, drop those that ran out,
publish this worker's node record, hand back leases whose runs have ended) and claiming (on
any change seen in either bucket, and every interval: claim and shed by `claim.plan`). The
local `StreamRegistry` stays the only place runs start and stop; this worker only writes its
desired set (`add` / `remove`), so fencing a stream is a `remove` there plus the `FencedSink`
that already drops its events.

What it reads is split out: the desired set as this worker may trust it (realtime.fleet.desired:
a value that is not one of its own config-file streams is held to its `sources:` policy), who
holds what (realtime.fleet.owners: leases and node records), and the listing the API shows
(realtime.fleet.views). This module keeps joining and leaving, the loops, and the registry.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient

from pipelines.events import EventSink
from realtime.config import AnyStreamSettings
from realtime.fleet import claim
from realtime.fleet.buckets import FleetBuckets, open_buckets
from realtime.fleet.desired import DesiredStreams, encode_stream
from realtime.fleet.fence import FencedSink
from realtime.fleet.keeper import LeaseKeeper
from realtime.fleet.mirror import KvMirror
from realtime.fleet.options import FleetOptions
from realtime.fleet.owners import LeaseReader
from realtime.fleet.records import LEASE_PREFIX, LeaseRecord, NodeRecord, lease_bucket, node_key
from realtime.fleet.views import FleetViews
from realtime.service.registry import (
    RegistryClosed,
    StreamExists,
    StreamLimitReached,
    StreamRegistry,
    UnknownStream,
)

log = logging.getLogger(__name__)

SYNC_TIMEOUT_S = 10.0
STALL_AFTER_RENEWALS = 3  # a node record the worker's own watch has not delivered after this many renewals
STALL_MIN_S = 3.0  # ... and at least this long: the watch is stalled
STATE_CHECK_S = 0.25  # how often stream states are compared with the last node record
_NATS_ERRORS = (nats.errors.Error, TimeoutError, OSError)


class FleetUnavailable(Exception):
    """The fleet's key-value store cannot be reached; nothing changed."""


class DuplicateNode(Exception):
    """Another live worker of this fleet runs under this worker's node name."""

    def __init__(self, fleet: str, node: str) -> None:
        super().__init__(
            f"another worker of fleet {fleet!r} is running as node {node!r}: give each worker its own --node"
        )
        self.fleet = fleet
        self.node = node


class FleetLimitReached(StreamLimitReached):
    setting = "fleet.max_streams"

    def __init__(self, limit: int, wanted: int) -> None:
        Exception.__init__(self, f"stream limit reached: {limit} streams in the fleet ({self.setting})")
        self.limit = limit
        self.wanted = wanted


@dataclass(slots=True)
class FleetCounters:
    fenced_events: int = 0  # events dropped because the lease was not valid
    claim_rounds: int = 0
    shed: int = 0
    duplicate_nodes: int = 0  # node records of this name written by another instance, seen after joining


class FleetWorker:
    def __init__(
        self,
        options: FleetOptions,
        registry: StreamRegistry,
        connection: Callable[[], NatsClient | None],
    ) -> None:
        self.options = options
        self.node = options.node
        self.registry = registry
        self._connection = connection
        self._buckets: FleetBuckets | None = None
        self._desired: KvMirror | None = None
        self._leases: KvMirror | None = None
        self._keeper: LeaseKeeper | None = None
        self.desired = DesiredStreams(lambda: self._desired, options.source_policy)
        self.leases = LeaseReader(self.node, lambda: self._leases, lambda: self._keeper, self._stale_after)
        self._views = FleetViews(self.node, self.desired, self.leases, registry, lambda: self._started)
        self.instance = uuid.uuid4().hex  # this run: a node record of this name with another is another worker
        self._duplicate_seen: set[int] = set()  # revisions of such records already logged
        self._joined = False  # past the node-name check: a record of this name by another is a duplicate
        self._started: dict[str, AnyStreamSettings] = {}  # what this worker put into its registry
        self._handing_back: set[str] = set()  # leases kept until their runs have ended, then released
        self._unowned_since: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._draining = False
        self._stopped = False
        self._reconnects = 0
        self._mirror_tasks: list[asyncio.Task[None]] = []
        self._published_states: dict[str, str] = {}
        self.share = 0
        self.counters = FleetCounters()

    # -- start and stop ------------------------------------------------------------------

    async def start(self, config_streams: Iterable[AnyStreamSettings]) -> None:
        """Open the buckets, read both of them, and seed the config's streams (config wins for its ids)."""
        try:
            await self._join(config_streams)
        except (*_NATS_ERRORS, nats.js.errors.Error) as exc:
            raise FleetUnavailable(str(exc) or type(exc).__name__) from None

    async def _join(self, config_streams: Iterable[AnyStreamSettings]) -> None:
        nc = self._connection()
        if nc is None:
            raise FleetUnavailable("not connected to NATS")
        js = nc.jetstream()
        options = self.options
        self._buckets = await open_buckets(js, options.name, lease_ttl_s=options.lease_ttl_s,
                                           replicas=options.replicas)
        self._desired = KvMirror(self._buckets.desired, on_change=self._changed)
        self._leases = KvMirror(self._buckets.leases, on_change=self._lease_changed)
        # Lease writes get a short request timeout: during a leader election a write stalls, and a
        # renewal that waits out nats-py's 5 s default retries too seldom to beat the lease's validity.
        keeper_js = nc.jetstream(timeout=min(5.0, max(1.0, 2 * options.renew_interval_s)))
        keeper_kv = await keeper_js.key_value(lease_bucket(options.name))
        self._keeper = LeaseKeeper(keeper_kv, self.node, self._buckets.lease_ttl_s,
                                   on_write=self._leases.note, tombstone=self._leases.tombstone)
        self._reconnects = nc.stats.get("reconnects", 0)
        self._mirror_tasks = [
            asyncio.create_task(self._desired.run(), name="fleet-desired-watch"),
            asyncio.create_task(self._leases.run(), name="fleet-lease-watch"),
        ]
        try:
            async with asyncio.timeout(SYNC_TIMEOUT_S):
                await self._desired.synced.wait()
                await self._leases.synced.wait()
            await self._check_node_name()  # before this worker writes anything
        except BaseException as exc:  # not joined (no sync in time, a duplicate, cancelled): watch nothing
            await self._stop_mirrors()
            if isinstance(exc, DuplicateNode):
                self._stopped = True
                self._keeper = None  # so stop() never deletes the other worker's record
            raise
        self._joined = True
        config_streams = list(config_streams)
        self.desired.trust(config_streams)
        for settings in config_streams:
            await self._seed(settings)
        log.info("fleet joined", extra={"fleet": options.name, "node": self.node, "capacity": self.capacity,
                                        "lease_ttl_s": self._buckets.lease_ttl_s,
                                        "renew_interval_s": options.renew_interval_s,
                                        "desired": len(self._desired)})

    async def run(self) -> None:
        """The renewal and claim loops, until cancelled (after `drain` and `stop`)."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._renew_loop(), name="fleet-renew")
                group.create_task(self._claim_loop(), name="fleet-claim")
                group.create_task(self._state_loop(), name="fleet-states")
        finally:
            await self._stop_mirrors()

    async def _stop_mirrors(self) -> None:
        """Cancel the bucket watches and wait for them to end (none is left behind unawaited)."""
        tasks, self._mirror_tasks = self._mirror_tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _check_node_name(self) -> None:
        """DuplicateNode if another live worker holds this node name. A record of this name that
        exists now is another process's; it is live if it is rewritten before it expires."""
        leases = self._leases
        assert leases is not None and self._buckets is not None
        key = node_key(self.node)
        first = leases.get(key)
        if first is None:
            return
        record = NodeRecord.decode(first.value)
        log.info("a record of this node name exists; waiting to see whether its worker is alive",
                 extra={"node": self.node, "instance": record.instance if record is not None else None,
                        "revision": first.revision, "wait_s": round(self._stale_after(), 1)})
        deadline = time.monotonic() + self._stale_after()
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

    def drain(self) -> None:
        """Shutting down: claim nothing more (leases stay renewed while the streams stop)."""
        self._draining = True

    async def stop(self) -> None:
        """After the streams have stopped: hand every lease back and leave the fleet at once."""
        self._draining = self._stopped = True
        keeper, buckets = self._keeper, self._buckets
        if keeper is None or buckets is None:
            return
        await asyncio.gather(*(keeper.release(sid) for sid in keeper.held()), return_exceptions=True)
        with contextlib.suppress(*_NATS_ERRORS, nats.js.errors.KeyValueError):
            await buckets.leases.delete(node_key(self.node))
        await self._stop_mirrors()
        log.info("fleet left", extra={"fleet": self.options.name, "node": self.node})

    # -- what the service asks -----------------------------------------------------------

    @property
    def capacity(self) -> int:
        return max(1, min(self.options.capacity, self.registry.max_streams))

    @property
    def ready(self) -> bool:
        if self._desired is None or self._leases is None or self._stopped:
            return False
        alive = bool(self._mirror_tasks) and all(not task.done() for task in self._mirror_tasks)
        return alive and self._desired.synced.is_set() and self._leases.synced.is_set()

    @property
    def keeper(self) -> LeaseKeeper | None:
        return self._keeper

    @property
    def watch_stalls(self) -> int:
        return sum(m.stalls for m in (self._desired, self._leases) if m is not None)

    @property
    def desired_count(self) -> int:
        return len(self._desired) if self._desired is not None else 0

    def live_nodes(self) -> int:
        return len(self.leases.other_nodes()) + 1

    def sink_for(self, stream_id: str, sink: EventSink) -> EventSink:
        keeper = self._keeper
        assert keeper is not None

        def fenced() -> None:
            self.counters.fenced_events += 1

        return FencedSink(sink, lambda: keeper.token(stream_id), fenced)

    def is_fleet_stream(self, stream_id: str) -> bool:
        return stream_id in self._started

    # -- the API -------------------------------------------------------------------------

    async def add(self, settings: AnyStreamSettings) -> dict[str, Any]:
        desired = self._require_open()
        if settings.id in self.desired.ids() or settings.id in self.registry:
            raise StreamExists(settings.id)
        if len(desired) + 1 > self.options.max_streams:
            raise FleetLimitReached(self.options.max_streams, len(desired) + 1)
        value = encode_stream(settings)
        assert self._buckets is not None
        try:
            revision = await self._buckets.desired.create(settings.id, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            raise StreamExists(settings.id) from None
        except _NATS_ERRORS as exc:
            raise FleetUnavailable(str(exc) or type(exc).__name__) from None
        desired.note(settings.id, value, revision)
        log.info("stream desired in the fleet", extra={"stream_id": settings.id, "revision": revision})
        return self.view(settings.id)

    async def remove(self, stream_id: str) -> None:
        desired = self._require_open()
        seen = desired.get(stream_id)
        if seen is None:
            if stream_id in self.registry and stream_id not in self._started:
                self.registry.remove(stream_id)  # a browser session: this worker's own
                return
            raise UnknownStream(stream_id)
        assert self._buckets is not None
        try:
            await self._buckets.desired.delete(stream_id)
        except _NATS_ERRORS as exc:
            raise FleetUnavailable(str(exc) or type(exc).__name__) from None
        desired.forget(stream_id, seen.revision)
        log.info("stream removed from the fleet", extra={"stream_id": stream_id})

    def views(self) -> list[dict[str, Any]]:
        return self._views.all()

    def view(self, stream_id: str) -> dict[str, Any]:
        return self._views.one(stream_id)

    # -- loops ---------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        keeper = self._keeper
        assert keeper is not None
        interval = self.options.renew_interval_s
        while not self._stopped:
            began = time.monotonic()
            try:
                await self._renew_round(keeper)
            except Exception:  # a bug here must not stop the service; leases run out and fence the streams
                log.exception("fleet renewal round failed")
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))

    async def _renew_round(self, keeper: LeaseKeeper) -> None:
        self._watch_reconnects()
        keeper.drop_expired()
        await asyncio.gather(*(keeper.renew(sid) for sid in keeper.held()))
        self._sync_registry()
        for stream_id in list(self._handing_back):
            if not self.registry.active(stream_id):
                self._handing_back.discard(stream_id)
                await keeper.release(stream_id)
        await self._publish_node_record()

    async def _claim_loop(self) -> None:
        # Workers starting together first see each other's node records, so the first claims spread.
        await asyncio.sleep(self.options.renew_interval_s)
        while not self._stopped:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.options.renew_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                if not self._draining:
                    await self._claim_round()
                self._sync_registry()
            except Exception:
                log.exception("fleet claim round failed")

    async def _claim_round(self) -> None:
        keeper = self._keeper
        assert keeper is not None
        self.counters.claim_rounds += 1
        desired = [sid for sid in self.desired.ids() if self.desired.refusal(sid) is None]
        wanted = set(desired)
        owners = self.leases.owners()
        now = time.monotonic()
        for sid in list(self._unowned_since):
            if sid not in wanted or sid in owners:
                del self._unowned_since[sid]
        for sid in desired:
            if sid not in owners:
                self._unowned_since.setdefault(sid, now)
        orphaned = [sid for sid, since in self._unowned_since.items() if now - since >= self.options.orphan_after_s]
        nodes = self.leases.other_nodes()
        loads = {name: claim.NodeLoad(sum(1 for o in owners.values() if o == name), rec.capacity)
                 for name, rec in nodes.items()}
        decision = claim.plan(node=self.node, desired=desired, owners=owners, nodes=loads,
                              capacity=self.capacity - len(self._handing_back), slack=self.options.slack,
                              orphaned=orphaned)
        self.share = decision.share
        for stream_id in decision.claim:
            if self._draining:
                return
            await keeper.acquire(stream_id)
        for stream_id in decision.shed:
            # One hand-back at a time: until it is done this worker still counts the stream as its own.
            if stream_id in keeper and not self._handing_back:
                self.counters.shed += 1
                # What this worker saw, so a surprising hand-back can be traced to a stale view.
                log.info("handing a stream back to spread the load", extra={
                    "stream_id": stream_id, "share": decision.share, "desired": len(desired),
                    "held": sorted(keeper.held()), "others": {n: load.streams for n, load in loads.items()}})
                self._handing_back.add(stream_id)

    # -- keeping the registry to the leases ------------------------------------------------

    def _sync_registry(self) -> None:
        keeper = self._keeper
        assert keeper is not None
        held = set(keeper.held())
        desired = set(self.desired.ids())
        for stream_id in held:
            if stream_id not in desired and stream_id not in self._handing_back:
                self._handing_back.add(stream_id)  # deleted from the fleet: stop it, then hand the lease back
        for stream_id, settings in list(self._started.items()):
            wanted = self.desired.settings(stream_id)
            if stream_id not in held or stream_id in self._handing_back or wanted != settings:
                del self._started[stream_id]
                with contextlib.suppress(UnknownStream, RegistryClosed):
                    self.registry.remove(stream_id)
        if self.registry.closing:
            return
        for stream_id in held - self._handing_back - set(self._started):
            wanted = self.desired.settings(stream_id)
            if wanted is None:
                continue
            if self.desired.refusal(stream_id) is not None:  # changed to what this worker may not open
                self._handing_back.add(stream_id)
                continue
            try:
                self.registry.add(wanted)
            except (StreamExists, StreamLimitReached, RegistryClosed) as exc:
                log.warning("cannot run a claimed stream; handing it back",
                            extra={"stream_id": stream_id, "error": str(exc) or type(exc).__name__})
                self._handing_back.add(stream_id)
                continue
            self._started[stream_id] = wanted

    async def _state_loop(self) -> None:
        """Between renewals, a change of a stream's state (live, stalled, ...) is published at once,
        so other workers' listings follow within a fraction of a second."""
        while not self._stopped:
            await asyncio.sleep(STATE_CHECK_S)
            if self._buckets is not None and self._states() != self._published_states:
                await self._publish_node_record()

    def _states(self) -> dict[str, str]:
        states = {}
        for stream_id in self._started:
            with contextlib.suppress(UnknownStream):
                states[stream_id] = self.registry.get(stream_id).state
        return states

    async def _publish_node_record(self) -> None:
        buckets, leases = self._buckets, self._leases
        assert buckets is not None and leases is not None
        states = self._states()
        self._published_states = states
        record = NodeRecord(self.node, self.capacity, self._draining, states, self.instance).encode()
        try:
            revision = await buckets.leases.put(node_key(self.node), record)
        except _NATS_ERRORS:
            return  # the next round tries again; others see this worker as gone after the TTL
        leases.note(node_key(self.node), record, revision)
        leases.expect(revision)

    # -- reading the mirrors ---------------------------------------------------------------

    def _stale_after(self) -> float:
        keeper = self._keeper
        ttl = keeper.ttl_s if keeper is not None else self.options.lease_ttl_s
        return ttl + self.options.renew_interval_s  # in case an expiry marker was missed

    # -- changes seen ----------------------------------------------------------------------

    def _changed(self, key: str) -> None:
        self.desired.changed(key)
        self._wake.set()

    def _lease_changed(self, key: str) -> None:
        if key == node_key(self.node):
            self._other_instance(key)
        if not key.startswith(LEASE_PREFIX) or self._keeper is None or self._leases is None:
            self._wake.set()  # a node record: the spread may have changed
            return
        seen = self._leases.get(key)
        before = self.leases.known_owner(key)
        if seen is None:
            self.leases.forget(key)
            node = None
        else:
            node = self.leases.owner_of(key, seen.revision, seen.value)
        if before is None or before[1] != node:
            self._wake.set()  # a renewal by the same owner changes nothing worth a claim round
        stream_id = key[len(LEASE_PREFIX):]
        if stream_id not in self._keeper:
            return
        record = LeaseRecord.decode(seen.value) if seen is not None else None
        if seen is None:
            # Expired on the server (this worker was paused or cut off): fence at once.
            self._keeper.forfeit(stream_id, "expired")
            self._sync_registry()
        elif record is not None and record.node != self.node:
            self._keeper.forfeit(stream_id, f"now held by {record.node}")
            self._sync_registry()

    def _other_instance(self, key: str) -> None:
        """Two workers that joined at the same moment both saw no record of their name: the one that
        sees the other's says so (the next start of either refuses)."""
        seen = self._leases.get(key) if self._leases is not None else None
        if not self._joined or seen is None or seen.revision in self._duplicate_seen:
            return  # before joining, _check_node_name judges the record (a crashed run's is no duplicate)
        record = NodeRecord.decode(seen.value)
        if record is None or not record.instance or record.instance == self.instance:
            return
        if len(self._duplicate_seen) >= 64:
            self._duplicate_seen.clear()
        self._duplicate_seen.add(seen.revision)
        self.counters.duplicate_nodes += 1
        log.error("another worker writes this node's record: two workers share one --node",
                  extra={"fleet": self.options.name, "node": self.node, "other_instance": record.instance,
                         "revision": seen.revision})

    def _watch_reconnects(self) -> None:
        nc = self._connection()
        if nc is None or self._desired is None or self._leases is None:
            return
        reconnects = nc.stats.get("reconnects", 0)
        if reconnects != self._reconnects:
            self._reconnects = reconnects
            self._desired.restart()
            self._leases.restart()
        elif self._leases.overdue(self._stall_after_s()):
            # This worker's node record went out a while ago and its own watch has not seen it: the
            # watch's consumer is gone with a NATS node. The desired watch most likely went with it.
            log.warning("fleet watch stalled; watching again",
                        extra={"fleet": self.options.name, "node": self.node})
            self._desired.restart(stalled=True)
            self._leases.restart(stalled=True)

    def _stall_after_s(self) -> float:
        return max(STALL_AFTER_RENEWALS * self.options.renew_interval_s, STALL_MIN_S)

    async def _seed(self, settings: AnyStreamSettings) -> None:
        assert self._buckets is not None and self._desired is not None
        if self.desired.settings(settings.id) == settings:
            return
        value = encode_stream(settings)
        revision = await self._buckets.desired.put(settings.id, value)
        self._desired.note(settings.id, value, revision)

    def _require_open(self) -> KvMirror:
        if self._draining or self._desired is None:
            raise RegistryClosed("the service is shutting down")
        return self._desired
