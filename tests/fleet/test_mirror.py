"""Against a real nats-server: a bucket's mirror follows the watch, and a watch whose consumer
vanished on the server (as when the NATS node holding it dies) is found out by a write of this
worker that never comes through, and started again."""

from __future__ import annotations

import asyncio
import contextlib

import nats

from realtime.bus.embedded import EmbeddedNatsServer
from realtime.fleet.mirror import KvMirror
from tests.support.waiting import wait_until


def test_a_watch_whose_consumer_is_gone_is_noticed_by_an_overdue_write_and_restarted(
    fleet_nats: EmbeddedNatsServer,
) -> None:
    async def scenario() -> None:
        nc = await nats.connect(fleet_nats.url)
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="mirror-stall")
        mirror = KvMirror(kv)
        task = asyncio.create_task(mirror.run())
        try:
            first = await kv.put("node.a", b"1")
            mirror.expect(first)
            await wait_until(lambda: (seen := mirror.get("node.a")) is not None and seen.revision == first)
            assert not mirror.overdue(0.0)  # delivered: nothing expected any more
            # The server loses the watch's consumer; nats-py keeps waiting on its heartbeats.
            for info in await js.consumers_info("KV_mirror-stall"):
                await js.delete_consumer("KV_mirror-stall", info.name)
            second = await kv.put("node.a", b"2")
            mirror.expect(second)
            await asyncio.sleep(0.5)
            assert mirror.get("node.a").revision == first  # type: ignore[union-attr]
            assert not mirror.overdue(1.0)  # not yet past the grace
            assert mirror.overdue(0.3)
            mirror.restart(stalled=True)
            await wait_until(lambda: (seen := mirror.get("node.a")) is not None and seen.revision == second)
            assert mirror.stalls == 1 and not mirror.overdue(0.0)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await nc.close()

    asyncio.run(scenario())
