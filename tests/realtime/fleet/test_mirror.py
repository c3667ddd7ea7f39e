"""Against a real nats-server: a bucket's mirror follows the watch, and a watch whose consumer
vanished on the server (as when the NATS node holding it dies) is found out by a write of this
worker that never comes through, and started again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import nats
from nats.js.api import KeyValueConfig

from pipelines.tasks import cancel_and_wait
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.fleet.mirror import KvMirror, Seen
from tests.support.clock import FakeClock
from tests.support.waiting import eventually, wait_until


@contextlib.asynccontextmanager
async def watching(mirror: KvMirror) -> AsyncIterator[KvMirror]:
    """The mirror's watch runs for the block, and is cancelled and waited for after it."""
    task = asyncio.create_task(mirror.run())
    try:
        yield mirror
    finally:
        await cancel_and_wait(task)


def test_a_watch_whose_consumer_is_gone_is_noticed_by_an_overdue_write_and_restarted(
    fleet_nats: EmbeddedNatsServer,
) -> None:
    async def scenario() -> None:
        nc = await nats.connect(fleet_nats.url)
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="mirror-stall")
        clock = FakeClock()
        mirror = KvMirror(kv, clock=clock)  # the grace is judged on this clock, not the machine's pace
        try:
            async with watching(mirror):
                first = await kv.put("node.a", b"1")
                mirror.expect(first)
                await wait_until(lambda: (seen := mirror.get("node.a")) is not None and seen.revision == first)
                assert not mirror.overdue(0.0)  # delivered: nothing expected any more
                # The server loses the watch's consumer; nats-py keeps waiting on its heartbeats.
                for info in await js.consumers_info("KV_mirror-stall"):
                    await js.delete_consumer("KV_mirror-stall", info.name)
                second = await kv.put("node.a", b"2")
                mirror.expect(second)
                await asyncio.sleep(0.5)  # time enough for a live watch to deliver it
                assert mirror.get("node.a").revision == first  # type: ignore[union-attr]
                clock.advance(0.5)
                assert not mirror.overdue(1.0)  # not yet past the grace
                assert mirror.overdue(0.3)
                mirror.restart(stalled=True)
                await wait_until(lambda: (seen := mirror.get("node.a")) is not None and seen.revision == second)
                assert mirror.stalls == 1 and not mirror.overdue(0.0)
        finally:
            await nc.close()

    asyncio.run(scenario())


def test_a_replay_from_a_replica_that_is_behind_neither_loses_nor_rolls_back_what_is_known() -> None:
    """After a NATS node is lost, a new watch may read a replica that has not caught up: a key
    written since is missing from its replay, another comes at an older revision. Taking that as
    the bucket's state would look like this worker's fresh lease expired."""
    changed: list[str] = []
    mirror = KvMirror(None, on_change=changed.append)  # type: ignore[arg-type]  # no watch runs here
    mirror.note("lease.old", b"w1", 10)
    mirror.note("lease.renewed", b"w1", 14)
    mirror.note("lease.new", b"w1", 15)
    mirror.note("lease.gone", b"w0", 3)
    changed.clear()
    replay = {"lease.old": Seen(b"w1", 10, 0.0), "lease.renewed": Seen(b"w1", 12, 0.0)}
    mirror._replace(replay, replayed_up_to=12)
    assert mirror.get("lease.new") is not None and mirror.get("lease.new").revision == 15  # type: ignore[union-attr]
    assert mirror.get("lease.renewed").revision == 14  # type: ignore[union-attr]
    # Older than what the replay covered and absent from it: it really is gone.
    assert mirror.get("lease.gone") is None
    assert changed == ["lease.gone"]
    # A replay that is current takes over.
    mirror._replace({"lease.new": Seen(b"w0", 20, 0.0)}, replayed_up_to=20)
    assert sorted(k for k, _ in mirror.items()) == ["lease.new"]
    assert mirror.get("lease.new").value == b"w0"  # type: ignore[union-attr]


class _MarkerFirst:
    """A real watch whose end-of-replay marker comes ahead of its replay, as nats-py's does when
    the replay is still on the wire while it asks the server what is pending (nats.py #842)."""

    def __init__(self, watcher: Any) -> None:
        self._watcher = watcher
        self._sub = watcher._sub
        self._marked = False

    async def updates(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109  # nats-py's signature
        if not self._marked:
            self._marked = True
            return None
        return await self._watcher.updates(timeout=timeout)

    async def stop(self) -> None:
        await self._watcher.stop()


def test_an_end_of_replay_marker_ahead_of_the_replay_does_not_end_it(fleet_nats: EmbeddedNatsServer) -> None:
    async def scenario() -> None:
        nc = await nats.connect(fleet_nats.url)
        kv = await nc.jetstream().create_key_value(bucket="mirror-early-marker")
        written = {key: await kv.put(key, key.encode()) for key in ("stream.a", "stream.b", "stream.c")}
        await kv.delete("stream.c")
        real_watchall = kv.watchall

        async def marker_first(**kwargs: Any) -> Any:
            return _MarkerFirst(await real_watchall(**kwargs))

        kv.watchall = marker_first  # type: ignore[method-assign]
        mirror = KvMirror(kv)
        try:
            async with watching(mirror):
                await asyncio.wait_for(mirror.synced.wait(), 10.0)
                # What the bucket held is all there the moment the mirror says it is synced.
                assert {key: seen.revision for key, seen in mirror.items()} == \
                    {key: written[key] for key in ("stream.a", "stream.b")}
                assert mirror.tombstone("stream.c") is not None
        finally:
            await nc.close()

    asyncio.run(scenario())


def test_a_bucket_whose_every_entry_expired_is_synced_at_once(fleet_nats: EmbeddedNatsServer) -> None:
    """A fleet restarted after its lease bucket emptied: the new watch has nothing to replay, and
    its consumer reports the stream's last sequence as delivered though it sent nothing."""
    async def scenario() -> None:
        nc = await nats.connect(fleet_nats.url)
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket="mirror-expired", ttl=0.3))
        await kv.put("node.a", b"1")

        async def empty() -> bool:
            state = (await js.stream_info("KV_mirror-expired")).state
            return state.messages == 0 and state.last_seq > 0
        await eventually(empty, 10.0, "the bucket's only entry to expire")
        mirror = KvMirror(kv)
        try:
            async with watching(mirror):
                await asyncio.wait_for(mirror.synced.wait(), 10.0)
                assert mirror.items() == []
        finally:
            await nc.close()

    asyncio.run(scenario())
