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
(realtime.fleet.views). So is what it does beside the loops: joining and leaving, with the
buckets, their watches, the node record and the node-name check (realtime.fleet.membership);
keeping the registry to the leases (realtime.fleet.runs); and the API's writes to the desired set
(realtime.fleet.desired_writes). This module keeps the loops, which decide what to claim and shed
and when, and is the one object the service, its API and its metrics use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import nats.js.errors
from nats.aio.client import Client as NatsClient

from pipelines.events import EventSink
from pipelines.tasks import wait_set
from realtime.config import AnyStreamSettings
from realtime.fleet import claim
from realtime.fleet.desired import DesiredStreams
from realtime.fleet.desired_writes import DesiredWriter, FleetLimitReached
from realtime.fleet.fence import FencedSink
from realtime.fleet.membership import NATS_ERRORS, DuplicateNode, FleetUnavailable, Membership
from realtime.fleet.owners import LeaseReader
from realtime.fleet.runs import LeasedRuns
from realtime.fleet.views import FleetViews
from realtime.leases.keeper import LeaseKeeper
from realtime.leases.options import FleetOptions
from realtime.leases.records import LEASE_PREFIX, LeaseRecord
from realtime.streams.registry import StreamRegistry

__all__ = ["DuplicateNode", "FleetCounters", "FleetLimitReached", "FleetUnavailable", "FleetWorker"]

log = logging.getLogger(__name__)

STATE_CHECK_S = 0.25  # how often stream states are compared with the last node record


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
        self.counters = FleetCounters()
        self.membership = membership = Membership(
            options, connection, on_desired_change=self._changed, on_lease_change=self._lease_changed,
            on_duplicate=self._count_duplicate)
        self.desired = DesiredStreams(lambda: membership.desired_mirror, options.source_policy)
        self.leases = LeaseReader(self.node, lambda: membership.lease_mirror, lambda: membership.keeper,
                                  membership.stale_after)
        self.runs = runs = LeasedRuns(registry, self.desired, lambda: membership.keeper)
        self._views = FleetViews(self.node, self.desired, self.leases, registry, lambda: runs.started)
        self._writes = DesiredWriter(membership, self.desired, registry, max_streams=options.max_streams,
                                     started=lambda: runs.started, closed=lambda: self._draining)
        self._unowned_since: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._draining = False
        self._stopped = False
        self._published_states: dict[str, str] = {}
        self.share = 0

    # -- start and stop ------------------------------------------------------------------

    async def start(self, config_streams: Iterable[AnyStreamSettings]) -> None:
        """Open the buckets, read both of them, and seed the config's streams (config wins for its ids)."""
        try:
            await self._join(config_streams)
        except (*NATS_ERRORS, nats.js.errors.Error) as exc:
            raise FleetUnavailable(str(exc) or type(exc).__name__) from None

    async def _join(self, config_streams: Iterable[AnyStreamSettings]) -> None:
        try:
            await self.membership.join()
        except DuplicateNode:
            self._stopped = True
            raise
        config_streams = list(config_streams)
        self.desired.trust(config_streams)
        for settings in config_streams:
            await self._writes.seed(settings)
        buckets = self.membership.buckets
        assert buckets is not None
        log.info("fleet joined", extra={"fleet": self.options.name, "node": self.node, "capacity": self.capacity,
                                        "lease_ttl_s": buckets.lease_ttl_s,
                                        "renew_interval_s": self.options.renew_interval_s,
                                        "desired": self.desired_count})

    async def run(self) -> None:
        """The renewal and claim loops, until cancelled (after `drain` and `stop`)."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._renew_loop(), name="fleet-renew")
                group.create_task(self._claim_loop(), name="fleet-claim")
                group.create_task(self._state_loop(), name="fleet-states")
        finally:
            await self.membership.stop_watches()

    def drain(self) -> None:
        """Shutting down: claim nothing more (leases stay renewed while the streams stop)."""
        self._draining = True

    async def stop(self) -> None:
        """After the streams have stopped: hand every lease back and leave the fleet at once."""
        self._draining = self._stopped = True
        await self.membership.leave()

    # -- what the service asks -----------------------------------------------------------

    @property
    def capacity(self) -> int:
        return max(1, min(self.options.capacity, self.registry.max_streams))

    @property
    def ready(self) -> bool:
        return not self._stopped and self.membership.watching

    @property
    def keeper(self) -> LeaseKeeper | None:
        return self.membership.keeper

    @property
    def instance(self) -> str:
        return self.membership.instance

    @property
    def watch_stalls(self) -> int:
        return self.membership.watch_stalls

    @property
    def desired_count(self) -> int:
        mirror = self.membership.desired_mirror
        return len(mirror) if mirror is not None else 0

    def live_nodes(self) -> int:
        return len(self.leases.other_nodes()) + 1

    def sink_for(self, stream_id: str, sink: EventSink) -> EventSink:
        keeper = self.keeper
        assert keeper is not None

        def fenced() -> None:
            self.counters.fenced_events += 1

        return FencedSink(sink, lambda: keeper.token(stream_id), fenced)

    def is_fleet_stream(self, stream_id: str) -> bool:
        return stream_id in self.runs.started

    # -- the API -------------------------------------------------------------------------

    async def add(self, settings: AnyStreamSettings) -> dict[str, Any]:
        await self._writes.add(settings)
        return self.view(settings.id)

    async def remove(self, stream_id: str) -> None:
        await self._writes.remove(stream_id)

    def views(self) -> list[dict[str, Any]]:
        return self._views.all()

    def view(self, stream_id: str) -> dict[str, Any]:
        return self._views.one(stream_id)

    # -- loops ---------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        keeper = self.keeper
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
        self.membership.check_watches()
        keeper.drop_expired()
        async with asyncio.TaskGroup() as renewals:  # a bug in one leaves none running unawaited
            for sid in keeper.held():
                renewals.create_task(keeper.renew(sid), name=f"fleet-renew-{sid}")
        self.runs.sync()
        await self.runs.release_ended(keeper)
        await self._publish_node_record()

    async def _claim_loop(self) -> None:
        # Workers starting together first see each other's node records, so the first claims spread.
        await asyncio.sleep(self.options.renew_interval_s)
        while not self._stopped:
            await wait_set(self._wake, self.options.renew_interval_s)
            self._wake.clear()
            try:
                if not self._draining:
                    await self._claim_round()
                self.runs.sync()
            except Exception:
                log.exception("fleet claim round failed")

    async def _claim_round(self) -> None:
        keeper = self.keeper
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
                              capacity=self.capacity - len(self.runs.handing_back), slack=self.options.slack,
                              orphaned=orphaned)
        self.share = decision.share
        for stream_id in decision.claim:
            if self._draining:
                return
            await keeper.acquire(stream_id)
        for stream_id in decision.shed:
            # One hand-back at a time: until it is done this worker still counts the stream as its own.
            if stream_id in keeper and not self.runs.handing_back:
                self.counters.shed += 1
                # What this worker saw, so a surprising hand-back can be traced to a stale view.
                log.info("handing a stream back to spread the load", extra={
                    "stream_id": stream_id, "share": decision.share, "desired": len(desired),
                    "held": sorted(keeper.held()), "others": {n: load.streams for n, load in loads.items()}})
                self.runs.handing_back.add(stream_id)

    async def _state_loop(self) -> None:
        """Between renewals, a change of a stream's state (live, stalled, ...) is published at once,
        so other workers' listings follow within a fraction of a second."""
        while not self._stopped:
            await asyncio.sleep(STATE_CHECK_S)
            if self.membership.buckets is not None and self.runs.states() != self._published_states:
                await self._publish_node_record()

    async def _publish_node_record(self) -> None:
        states = self.runs.states()
        self._published_states = states
        await self.membership.publish(self.capacity, self._draining, states)

    # -- changes seen ----------------------------------------------------------------------

    def _changed(self, key: str) -> None:
        self.desired.changed(key)
        self._wake.set()

    def _lease_changed(self, key: str) -> None:
        keeper, mirror = self.membership.keeper, self.membership.lease_mirror
        if not key.startswith(LEASE_PREFIX) or keeper is None or mirror is None:
            self._wake.set()  # a node record: the spread may have changed
            return
        seen = mirror.get(key)
        before = self.leases.known_owner(key)
        if seen is None:
            self.leases.forget(key)
            node = None
        else:
            node = self.leases.owner_of(key, seen.revision, seen.value)
        if before is None or before[1] != node:
            self._wake.set()  # a renewal by the same owner changes nothing worth a claim round
        stream_id = key[len(LEASE_PREFIX):]
        if stream_id not in keeper:
            return
        record = LeaseRecord.decode(seen.value) if seen is not None else None
        if seen is None:
            # Expired on the server (this worker was paused or cut off): fence at once.
            keeper.forfeit(stream_id, "expired")
            self.runs.sync()
        elif record is not None and record.node != self.node:
            keeper.forfeit(stream_id, f"now held by {record.node}")
            self.runs.sync()

    def _count_duplicate(self) -> None:
        self.counters.duplicate_nodes += 1
