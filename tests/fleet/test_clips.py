"""FleetClips (realtime/fleet/clips.py) on a real nats-server with real clip stores: a finished
clip's event queues its upload; what a worker left on its disk without uploading (killed between
the two) is uploaded by the reconcile pass; a stream's own bounds hold in the bucket; another
worker adopts a clip to serve it; a bucket outage leaves the local clips listed and says so."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient

from engines.media.remux import EncodedPacket
from pipelines.clips.stage import clip_event
from pipelines.clips.store import ClipStore, StreamBounds
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.fleet.clip_bucket import ClipBucket
from realtime.fleet.clips import FleetClips
from tests.support.waiting import wait_until

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def packets(sample_clip: Path) -> list[EncodedPacket]:
    from tests.engines.media.test_remux import demux

    return demux(str(sample_clip))[:30]  # three seconds of the sample, from its first keyframe


@pytest.fixture
async def nc(fleet_nats: EmbeddedNatsServer) -> AsyncIterator[NatsClient]:
    client = await nats.connect(fleet_nats.url)
    yield client
    await client.close()


def worker(root: Path, nc: NatsClient, bucket: str, name: str, streams: dict[str, StreamBounds] | None = None
           ) -> FleetClips:
    store = ClipStore(root / name, 10**10, 3600.0, streams or {})
    store.open()
    return FleetClips(store, ClipBucket(nc, bucket=bucket, max_bytes=10**9, max_age_s=3600.0,
                                        cache_dir=root / name / ".fleet-cache"))


def record(fleet: FleetClips, packets: list[EncodedPacket], stream_id: str = "cam") -> str:
    clip_id = uuid.uuid4().hex
    info = fleet.store.write(clip_id, stream_id, [(i / 10, p) for i, p in enumerate(packets)], ["a1"],
                             extras={".boxes.json": b'{"frames": []}'})
    assert info is not None
    fleet.tap(clip_event(info, captured_at=time.time()))
    return clip_id


async def test_a_clip_recorded_on_one_worker_is_uploaded_listed_adopted_and_deleted_everywhere(
    nc: NatsClient, packets: list[EncodedPacket], tmp_path: Path
) -> None:
    bucket = f"t-{uuid.uuid4().hex[:8]}"
    w0, w1 = worker(tmp_path, nc, bucket, "w0"), worker(tmp_path, nc, bucket, "w1")
    task = asyncio.create_task(w0.run())
    try:
        clip_id = record(w0, packets)
        await wait_until(lambda: w0.bucket.stats.uploaded == 1, 10, "the upload")
        listed, complete = await w1.list("cam")
        assert complete and [c.id for c in listed] == [clip_id] and w1.store.get(clip_id) is None
        adopted = await w1.find(clip_id)  # fetched into w1's own store, served from there
        assert adopted is not None and adopted.extras == (".boxes.json",) and w1.stats.adopted == 1
        path = w1.store.path(clip_id)
        assert path is not None and path.read_bytes() == (tmp_path / "w0" / f"{clip_id}.mp4").read_bytes()
        assert await w1.find("0" * 32) is None
        assert await w1.delete(clip_id)
        assert w1.store.get(clip_id) is None and await w1.bucket.get(clip_id) is None
    finally:
        task.cancel()


async def test_what_a_killed_worker_left_unuploaded_is_uploaded_by_the_reconcile_pass_within_its_streams_bounds(
    nc: NatsClient, packets: list[EncodedPacket], tmp_path: Path
) -> None:
    bucket = f"t-{uuid.uuid4().hex[:8]}"
    first = worker(tmp_path, nc, bucket, "w0")
    kept = [record(first, packets, "door") for _ in range(3)] + [record(first, packets, "yard")]
    # No run(): the worker died before uploading. It restarts with the same disk and one bound for
    # `door`: room for two of its clips in the bucket (each a few hundred kB).
    size = first.store.get(kept[0]).bytes  # type: ignore[union-attr]
    again = worker(tmp_path, nc, bucket, "w0", {"door": StreamBounds(max_bytes=2 * size + 1)})
    assert [c.id for c in again.store.list("door")] == kept[1:3]  # the same bound on its own disk
    await again.reconcile()
    assert again.stats.reconciled == 3  # door's two and yard's one
    listed, _ = await again.list()
    assert sorted(c.id for c in listed) == sorted(kept[1:])
    await again.reconcile()  # nothing more to do
    assert again.stats.reconciled == 3 and again.bucket.stats.uploaded == 3


async def test_an_outage_leaves_the_local_clips_listed_and_a_remote_one_unavailable(
    packets: list[EncodedPacket], tmp_path: Path
) -> None:
    from realtime.fleet.clips import ClipsUnavailable
    from tests.support.nats import running_server

    for server in running_server(tmp_path / "nats"):
        client = await nats.connect(server.url, max_reconnect_attempts=0)
        try:
            fleet = worker(tmp_path, client, "outage", "w0")
            local = record(fleet, packets)
            server.stop()
            await wait_until(lambda c=client: not c.is_connected, 10, "the connection to drop")
            listed, complete = await fleet.list()
            assert not complete and [c.id for c in listed] == [local] and fleet.stats.list_failed == 1
            with pytest.raises(ClipsUnavailable, match="retry"):
                await fleet.find("a" * 32)
            assert (await fleet.find(local)) is not None  # its own clips need no bucket
        finally:
            with contextlib.suppress(ConnectionError):  # the server is gone: closing finds the socket dead
                await client.close()


async def test_a_clip_deleted_through_another_worker_is_withdrawn_here_and_never_uploaded_again(
    nc: NatsClient, packets: list[EncodedPacket], tmp_path: Path
) -> None:
    bucket = f"t-{uuid.uuid4().hex[:8]}"
    recorder, other = worker(tmp_path, nc, bucket, "w0"), worker(tmp_path, nc, bucket, "w1")
    clip_id = record(recorder, packets)
    kept = record(recorder, packets)
    await recorder.reconcile()  # both uploaded
    assert recorder.stats.reconciled == 2
    assert await other.delete(clip_id)  # an operator deletes it on the other worker
    listed, _ = await recorder.list()
    assert [c.id for c in listed] == [kept]  # gone from the recorder's listing at once
    await recorder.reconcile()
    assert recorder.stats.withdrawn == 1 and recorder.store.get(clip_id) is None  # its copy removed
    assert await recorder.bucket.get(clip_id) is None and recorder.bucket.stats.uploaded == 2  # not re-uploaded
    # A restart keeps knowing what the bucket held: the next clip deleted elsewhere is withdrawn too.
    third = record(recorder, packets)
    await recorder.reconcile()
    assert await other.delete(third)
    again = worker(tmp_path, nc, bucket, "w0")
    await again.reconcile()
    assert again.stats.withdrawn == 1 and again.stats.reconciled == 0 and [c.id for c in again.store.list()] == [kept]
