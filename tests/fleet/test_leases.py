"""Lease keeping against a real nats-server: atomic create, compare-and-set renewals, expiry by
the bucket's max age, and the local validity that fences a paused owner."""

from __future__ import annotations

import asyncio

import nats

from realtime.bus.embedded import EmbeddedNatsServer
from realtime.fleet.buckets import open_buckets
from realtime.fleet.keeper import LeaseKeeper


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
            # a stops renewing (paused): its own view ends before the server lets b in.
            while a.token("cam") is not None:
                assert await b.acquire("cam") is None
                await asyncio.sleep(0.05)
            taken = None
            for _ in range(60):
                taken = await b.acquire("cam")
                if taken is not None:
                    break
                await asyncio.sleep(0.05)
            assert taken is not None and taken.token > lease.token
            # a wakes: its renewal fails on the revision, and it gives the lease up without writing.
            assert not await a.renew("cam") and "cam" not in a and a.counters.lost == 1
            assert b.token("cam") == taken.token
            # Handing back on purpose lets the next owner in at once.
            await b.release("cam")
            assert await a.acquire("cam") is not None
        finally:
            await nc.close()

    asyncio.run(scenario())
