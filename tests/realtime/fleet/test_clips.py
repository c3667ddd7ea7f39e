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
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from engines.media.remux import EncodedPacket
from pipelines.clips.stage import clip_event
from pipelines.clips.store import ClipStore, StreamBounds
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.fleet.clip_bucket import ClipBucket
from realtime.fleet.clips import ClipsUnavailable, FleetClips
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


async def test_a_forwarded_export_is_cut_by_the_worker_running_the_stream_and_garbage_gets_a_reason(
    nc: NatsClient, packets: list[EncodedPacket], tmp_path: Path
) -> None:
    import json

    from pipelines.clips.stage import ExportRefused
    from realtime.fleet.clips import ExportForwardRefused

    bucket = f"t-{uuid.uuid4().hex[:8]}"
    owner, asker = worker(tmp_path, nc, bucket, "w0"), worker(tmp_path, nc, bucket, "w1")
    for fleet_clips, node in ((owner, "w0"), (asker, "w1")):
        fleet_clips.fleet, fleet_clips.node = bucket, node
    asked: list[tuple[str, float, float]] = []

    async def export(stream_id: str, start: float, end: float) -> Any:
        asked.append((stream_id, start, end))
        if start > 100:
            raise ExportRefused("that span is not in the stream's buffer (it holds 0.000 to 3.000)")
        clip_id = record(owner, packets, stream_id)
        return owner.store.get(clip_id)

    owner.exporter = export
    task = asyncio.create_task(owner.run())
    try:
        await wait_until(lambda: owner.answering, 5, "the owner to answer exports")
        info = await asker.forward_export("w0", "cam", 0.5, 2.5)
        assert asked == [("cam", 0.5, 2.5)] and await asker.bucket.get(info.id) is not None  # uploaded first
        assert (await asker.find(info.id)) is not None  # and so served by the worker that asked
        with pytest.raises(ExportForwardRefused, match="not in the stream's buffer") as refused:
            await asker.forward_export("w0", "cam", 1000.0, 1001.0)
        assert refused.value.status == 409
        for garbage in (b"{", b'{"stream_id": "../x", "start": 0, "end": 1}', b'{"stream_id": "cam"}',
                        b'{"stream_id": "cam", "start": "NaN", "end": 1}', b"x" * 5000, b"[]"):
            reply = json.loads((await nc.request(owner.export_subject("w0"), garbage, timeout=5)).data)
            assert reply["status"] in (400, 409) and reply["error"], (garbage[:40], reply)
            if len(garbage) > 4096:
                assert reply["status"] == 400 and "at most" in reply["error"], reply
        with pytest.raises(ClipsUnavailable, match="does not answer"):
            await asker.forward_export("w9", "cam", 0.0, 1.0)  # no such worker
        assert owner.stats.exports_answered >= 2 and asker.stats.exports_forwarded == 3
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
