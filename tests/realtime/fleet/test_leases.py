"""Against a real nats-server: lease keeping (atomic create, compare-and-set renewals, expiry by
the bucket's max age, the local validity that fences a paused owner) and the desired set."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest

from realtime.bus.embedded import EmbeddedNatsServer
from realtime.config import CameraStreamSettings
from realtime.fleet.desired import decode_stream
from realtime.fleet.worker import FleetWorker
from realtime.leases.buckets import open_buckets
from realtime.leases.keeper import LeaseKeeper
from realtime.leases.options import FleetOptions
from realtime.leases.records import LeaseRecord, desired_bucket, lease_key
from realtime.streams.registry import StreamExists, StreamRegistry, UnknownStream
from tests.support.waiting import eventually


def test_one_owner_at_a_time_and_a_paused_owner_is_fenced_before_another_can_take_over(
    fleet_nats: EmbeddedNatsServer,
) -> None:
    async def scenario() -> None:
        nc = await nats.connect(fleet_nats.url)
        try:
            buckets = await open_buckets(nc.jetstream(), "leases-unit", lease_ttl_s=1.5, replicas=1)
            assert buckets.lease_ttl_s == 1.5
            # Another worker configured with another TTL uses the bucket's.
            again = await open_buckets(nc.jetstream(), "leases-unit", lease_ttl_s=9.0, replicas=1)
            assert again.lease_ttl_s == 1.5
            a = LeaseKeeper(buckets.leases, "a", buckets.lease_ttl_s)
            b = LeaseKeeper(buckets.leases, "b", buckets.lease_ttl_s)
            lease = await a.acquire("cam")
            assert lease is not None and a.token("cam") == lease.token
            assert await b.acquire("cam") is None and b.counters.contended == 1
            assert await a.renew("cam") and a.token("cam") == lease.token  # the token stays through renewals
            # a stops renewing (paused): its own view ends before the server lets b in. Checked once
            # b is in (the server let it in before that), never against a request that may reach
            # the server later than it was sent.
            taken = await eventually(lambda: b.acquire("cam"), 10.0, "b to take the lease")
            assert a.token("cam") is None
            assert taken.token > lease.token
            # a wakes: its renewal fails on the revision, and it gives the lease up without writing.
            assert not await a.renew("cam") and "cam" not in a and a.counters.lost == 1
            assert b.token("cam") == taken.token
            # Handing back on purpose lets the next owner in at once.
            await b.release("cam")
            assert await a.acquire("cam") is not None
        finally:
            await nc.close()

    asyncio.run(scenario())


def test_a_renewal_that_timed_out_but_was_stored_does_not_lose_the_lease(fleet_nats: EmbeddedNatsServer) -> None:
    async def scenario() -> None:
        nc = await nats.connect(fleet_nats.url)
        try:
            buckets = await open_buckets(nc.jetstream(), "leases-late", lease_ttl_s=5.0, replicas=1)
            a = LeaseKeeper(buckets.leases, "a", buckets.lease_ttl_s)
            lease = await a.acquire("cam")
            assert lease is not None
            # The renewal the worker gave up on (its answer lost in a leader election) was stored.
            await buckets.leases.update(lease_key("cam"), LeaseRecord("a", "cam").encode(), last=lease.revision)
            assert await a.renew("cam") and a.token("cam") == lease.token and a.counters.lost == 0
            # Another node's write is not taken for one's own.
            current = a._leases["cam"].revision
            await buckets.leases.update(lease_key("cam"), LeaseRecord("b", "cam").encode(), last=current)
            assert not await a.renew("cam") and a.counters.lost == 1
        finally:
            await nc.close()

    asyncio.run(scenario())


def test_config_streams_are_seeded_and_win_for_their_ids_while_api_streams_stay(
    fleet_nats: EmbeddedNatsServer, small_clip: Path
) -> None:
    async def scenario() -> None:
        nc = await nats.connect(fleet_nats.url)
        try:
            options = FleetOptions(name="seed", node="n1", capacity=2, lease_ttl_s=3.0, renew_interval_s=1.0)
            registry = StreamRegistry(lambda settings: None)  # type: ignore[arg-type, return-value]
            api_worker = FleetWorker(options, registry, lambda: nc)
            await api_worker.start([])
            await api_worker.add(CameraStreamSettings(id="cam", url=str(small_clip), detect_fps=5))
            await api_worker.add(CameraStreamSettings(id="api", url=str(small_clip)))
            with pytest.raises(StreamExists):
                await api_worker.add(CameraStreamSettings(id="api", url=str(small_clip)))
            configured = CameraStreamSettings(id="cam", url=str(small_clip), detect_fps=1)
            restarted = FleetWorker(options, StreamRegistry(lambda s: None), lambda: nc)  # type: ignore[arg-type, return-value]
            await restarted.start([configured])
            views = {v["id"]: v for v in restarted.views()}
            assert set(views) == {"cam", "api"}  # the API's stream survived the restart
            assert views["cam"]["detect_fps"] == 1  # the config won for its id
            assert views["api"]["owner"] is None and views["api"]["state"] == "pending"
            stored = await (await nc.jetstream().key_value(desired_bucket("seed"))).get("cam")
            assert decode_stream("cam", stored.value or b"") == configured
            await restarted.remove("api")
            with pytest.raises(UnknownStream):
                restarted.view("api")
            await api_worker.stop()
            await restarted.stop()
        finally:
            await nc.close()

    asyncio.run(scenario())
