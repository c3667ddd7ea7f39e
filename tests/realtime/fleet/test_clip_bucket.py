"""ClipBucket against a real nats-server: clips one worker uploads are listed and served whole by
another, retention and a full bucket delete the oldest, an upload cut midway is never listed nor
served (and is swept, or finished by a later put), an outage never raises, and the cache is bounded."""

from __future__ import annotations

import asyncio
import io
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from pipelines.clips.store import ClipInfo
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from realtime.fleet import clip_bucket
from realtime.fleet.clip_bucket import BACKSTOP_GRACE_S, ClipBucket, ClipBucketError, clip_bucket_name
from tests.realtime.fleet.conftest import write_small_clip
from tests.support.nats import running_server
from tests.support.waiting import eventually, wait_until

CHUNK = 128 * 1024  # nats-py's object chunk


@pytest.fixture(scope="module")
def mp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real H.264 MP4: 2 s of 160x120 frames of a moving block."""
    return write_small_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", seconds=2, size=(160, 120))


@pytest.fixture(scope="module")
def extras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("extras")
    boxes = directory / "x.boxes.json"
    boxes.write_text('{"frames": [{"t": 0.0, "objects": [{"class": "person", "box": [1, 2, 30, 40]}]}]}')
    vtt = directory / "x.vtt"
    vtt.write_text("WEBVTT\n\n00:00.000 --> 00:01.500\nsomeone at the door\n")
    return {".boxes.json": boxes, ".vtt": vtt}


@pytest.fixture
async def nc(fleet_nats: EmbeddedNatsServer) -> AsyncIterator[NatsClient]:
    client = await nats.connect(fleet_nats.url)
    yield client
    await client.close()


@pytest.fixture
async def nc2(fleet_nats: EmbeddedNatsServer) -> AsyncIterator[NatsClient]:
    """Another worker's connection."""
    client = await nats.connect(fleet_nats.url)
    yield client
    await client.close()


def read(path: Path) -> bytes:
    return path.read_bytes()


def new_id() -> str:
    return uuid.uuid4().hex


def sidecar(clip_id: str, *, created_at: float | None = None, stream_id: str = "door") -> dict[str, Any]:
    return ClipInfo(clip_id, stream_id, 10.0, 12.0, 2.0, 1000, "h264", 160, 120, ("alert-1",),
                    time.time() if created_at is None else created_at, (3,)).sidecar()


def bucket_for(nc: NatsClient, tmp_path: Path, name: str, cache: str = "cache", **options: Any) -> ClipBucket:
    settings: dict[str, Any] = {"max_bytes": 20_000_000, "max_age_s": 3600.0, **options}
    return ClipBucket(nc, bucket=name, cache_dir=tmp_path / cache, **settings)


def unique_bucket() -> str:
    return f"clips-{uuid.uuid4().hex[:10]}"


async def stream_state(nc: NatsClient, bucket: str) -> tuple[int, int]:
    info = await nc.jetstream().stream_info(f"OBJ_{bucket}")
    return info.state.messages, info.state.bytes


async def test_a_clip_one_worker_puts_is_listed_with_its_metadata_and_fetched_whole_by_another(
    nc: NatsClient, nc2: NatsClient, tmp_path: Path, mp4: Path, extras: dict[str, Path]
) -> None:
    name = unique_bucket()
    first = bucket_for(nc, tmp_path, name, "cache-1")
    clip_id = new_id()
    body = sidecar(clip_id)
    assert await first.put(body, {".mp4": mp4, **extras})
    expected = {**body, "extras": [".boxes.json", ".vtt"]}
    assert await first.list() == [expected]  # the metadata comes with the listing
    assert await first.list("door") == [expected] and await first.list("elsewhere") == []
    assert await first.get(clip_id) == expected
    assert await first.put(body, {".mp4": mp4, **extras})  # already there: not uploaded again
    assert first.stats.uploaded == 1

    second = bucket_for(nc2, tmp_path, name, "cache-2")  # another worker, on its own connection
    assert await second.list() == [expected]
    got = await second.fetch(clip_id, ".mp4")
    assert got == tmp_path / "cache-2" / f"{clip_id}.mp4" and read(got) == read(mp4)
    vtt = await second.fetch(clip_id, ".vtt")
    assert vtt is not None and read(vtt) == read(extras[".vtt"])
    assert await second.fetch(clip_id, ".events.json") is None  # not uploaded
    assert await second.fetch(new_id(), ".mp4") is None
    assert (second.stats.fetched, second.stats.fetch_failed, second.stats.cache_hits) == (2, 0, 0)
    assert await second.fetch(clip_id, ".mp4") == got
    assert (second.stats.fetched, second.stats.cache_hits) == (2, 1)
    assert not list((tmp_path / "cache-2").glob(".*.part"))
    samples = {(s.name, s.labels): s.value for s in second.samples()}
    assert samples[("vidsentry_clip_bucket_fetches", ())] == 2
    assert samples[("vidsentry_clip_bucket_evicted", (("reason", "age"),))] == 0


async def test_delete_removes_every_object_of_the_clip_and_its_cached_files(
    nc: NatsClient, tmp_path: Path, mp4: Path, extras: dict[str, Path]
) -> None:
    name = unique_bucket()
    bucket = bucket_for(nc, tmp_path, name)
    clip_id, other = new_id(), new_id()
    assert await bucket.put(sidecar(clip_id), {".mp4": mp4, **extras})
    assert await bucket.put(sidecar(other), {".mp4": mp4})
    kept = await stream_state(nc, name)
    cached = await bucket.fetch(clip_id, ".boxes.json")
    assert cached is not None and cached.exists()
    assert await bucket.delete(clip_id)
    assert [c["clip_id"] for c in await bucket.list()] == [other]
    assert await bucket.get(clip_id) is None and await bucket.fetch(clip_id, ".mp4") is None
    assert not cached.exists()
    messages, size = await stream_state(nc, name)
    assert messages == 2 and size < kept[1] - len(read(mp4))  # no chunk, meta or "deleted" marker left
    assert not await bucket.delete(clip_id)


async def test_a_listed_clip_whose_chunks_are_gone_is_not_served_and_the_wait_for_them_is_bounded(
    nc: NatsClient, tmp_path: Path, mp4: Path
) -> None:
    name = unique_bucket()
    bucket = bucket_for(nc, tmp_path, name, fetch_timeout_s=0.5)
    clip_id = new_id()
    assert await bucket.put(sidecar(clip_id), {".mp4": mp4})
    # What the stream's max-age backstop does for a moment: the chunks expire before the meta.
    js = nc.jetstream()
    info = await (await js.object_store(name)).get_info(f"{clip_id}.mp4")
    await js.purge_stream(f"OBJ_{name}", subject=f"$O.{name}.C.{info.nuid}")
    started = time.monotonic()
    assert await bucket.fetch(clip_id, ".mp4") is None  # nats-py alone would wait for ever
    assert time.monotonic() - started < 5 and bucket.stats.fetch_failed == 1
    assert not list((tmp_path / "cache").iterdir())  # no partial file
    assert await bucket.delete(clip_id) and await bucket.list() == []


async def test_enforce_deletes_clips_past_their_age_then_the_oldest_past_max_bytes(
    nc: NatsClient, tmp_path: Path, mp4: Path
) -> None:
    name = unique_bucket()
    bucket = bucket_for(nc, tmp_path, name, max_age_s=600.0)
    now = time.time()
    stale, *fresh = ids = [new_id() for _ in range(4)]
    for index, clip_id in enumerate(ids):
        created = now - 1000 if clip_id == stale else now - 10 + index
        assert await bucket.put(sidecar(clip_id, created_at=created), {".mp4": mp4})
    assert await bucket.enforce(now) == 1
    assert bucket.stats.evicted_age == 1 and bucket.stats.evicted_bytes == 0
    assert [c["clip_id"] for c in await bucket.list()] == fresh
    assert await bucket.enforce(now) == 0  # nothing more is due

    # A worker configured with less room: the bucket takes its limit and enforce() fits it.
    _, size = await stream_state(nc, name)
    smaller = bucket_for(nc, tmp_path, name, max_bytes=size - 1, max_age_s=600.0)
    assert await smaller.enforce(now) == 1
    assert smaller.stats.evicted_bytes == 1
    assert [c["clip_id"] for c in await smaller.list()] == fresh[1:]  # the oldest went
    config = (await nc.jetstream().stream_info(f"OBJ_{name}")).config
    assert config.max_bytes == size - 1 and config.max_age == pytest.approx(600.0 + BACKSTOP_GRACE_S)


async def test_a_full_bucket_makes_room_by_deleting_the_oldest_clips_and_refuses_a_clip_larger_than_it(
    nc: NatsClient, tmp_path: Path, mp4: Path
) -> None:
    name = unique_bucket()
    probe = bucket_for(nc, tmp_path, name)
    first, second, third = new_id(), new_id(), new_id()
    now = time.time()
    assert await probe.put(sidecar(first, created_at=now - 3), {".mp4": mp4})
    _, one_clip = await stream_state(nc, name)
    bucket = bucket_for(nc, tmp_path, name, max_bytes=int(one_clip * 2.5))
    assert await bucket.put(sidecar(second, created_at=now - 2), {".mp4": mp4})
    assert await bucket.put(sidecar(third, created_at=now - 1), {".mp4": mp4})  # full: the oldest makes room
    assert [c["clip_id"] for c in await bucket.list()] == [second, third]
    assert bucket.stats.evicted_bytes == 1 and bucket.stats.upload_failed == 0

    huge = tmp_path / "huge.mp4"
    huge.write_bytes(b"\0" * (3 * one_clip))
    assert not await bucket.put(sidecar(new_id()), {".mp4": huge})  # it can never fit: nothing evicted for it
    assert bucket.stats.upload_failed == 1 and bucket.stats.evicted_bytes == 1
    assert [c["clip_id"] for c in await bucket.list()] == [second, third]


class GatedReader(io.FileIO):
    """Gives two chunks, then waits for `release` (as a process stopped mid-upload would)."""

    def __init__(self, path: Path, reached: threading.Event, release: threading.Event) -> None:
        super().__init__(str(path), "r")
        self.reads = 0
        self.reached, self.release = reached, release

    def readinto(self, buffer: Any) -> int:
        self.reads += 1
        if self.reads == 3:
            self.reached.set()
            self.release.wait(10)
        return super().readinto(buffer) or 0


@pytest.mark.parametrize("cut", ["cancelled", "disconnected"])
async def test_an_upload_cut_midway_is_never_listed_nor_served_and_is_swept_or_finished_by_a_later_put(
    cut: str, fleet_nats: EmbeddedNatsServer, nc2: NatsClient, tmp_path: Path, *, extras: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = unique_bucket()
    big = tmp_path / "big.mp4"
    big.write_bytes(bytes(range(256)) * (6 * CHUNK // 256))
    reached, release = threading.Event(), threading.Event()
    opened: list[GatedReader] = []

    def gated(path: Path) -> Any:
        if path != big:
            return path.open("rb")
        opened.append(GatedReader(path, reached, release))
        return opened[-1]

    monkeypatch.setattr(clip_bucket, "_open_upload", gated)
    writer_nc = await nats.connect(fleet_nats.url)
    writer = bucket_for(writer_nc, tmp_path, name, "cache-w")
    clip_id = new_id()
    task = asyncio.create_task(writer.put(sidecar(clip_id), {".mp4": big, **extras}))
    try:
        assert await asyncio.to_thread(reached.wait, 10)  # the extras are up, and two chunks of the MP4
        if cut == "cancelled":
            task.cancel()
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            await writer_nc.close()
            release.set()
            assert await task is False
            assert writer.stats.upload_failed == 1 and writer.stats.uploaded == 0
    finally:
        release.set()
        await writer_nc.close()
    monkeypatch.undo()

    reader = bucket_for(nc2, tmp_path, name, "cache-r")
    assert await reader.list() == [] and await reader.get(clip_id) is None
    assert await reader.fetch(clip_id, ".mp4") is None
    assert await reader.fetch(clip_id, ".boxes.json") is None  # its extras are there, but never served alone
    assert not list((tmp_path / "cache-r").glob("*"))
    messages, _ = await stream_state(nc2, name)
    assert messages == 2 * 2 + 2  # the extras' chunks and metas, the MP4's first two chunks

    assert await reader.sweep() == 0  # young: might be an upload under way
    assert await reader.sweep(time.time() + reader.orphan_age_s + 5) == 3  # two extras, one chunk subject
    assert reader.stats.orphans_removed == 3
    assert await stream_state(nc2, name) == (0, 0)

    # The worker restarted with the clip on its disk: a put again finishes it.
    assert await reader.put(sidecar(clip_id), {".mp4": big, **extras})
    got = await reader.fetch(clip_id, ".mp4")
    assert got is not None and read(got) == read(big)


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    yield from running_server(tmp_path / "nats-store")


async def test_an_outage_never_raises_put_and_fetch_report_it_and_the_bucket_works_again_after(
    own_nats: EmbeddedNatsServer, tmp_path: Path, mp4: Path, extras: dict[str, Path]
) -> None:
    client = await nats.connect(own_nats.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1)
    try:
        # What must succeed runs with the default timeouts; only the outage's calls get short ones
        # (each waits its timeout out), from a second worker's view of the same bucket and cache.
        bucket = bucket_for(client, tmp_path, "clips-outage")
        served, later = new_id(), new_id()
        assert await bucket.put(sidecar(served), {".mp4": mp4, **extras})
        cached = await bucket.fetch(served, ".mp4")
        assert cached is not None

        own_nats.kill()
        cut = bucket_for(client, tmp_path, "clips-outage", request_timeout_s=0.5, fetch_timeout_s=2.0)
        assert not await cut.put(sidecar(later), {".mp4": mp4})
        assert cut.stats.upload_failed == 1
        assert await cut.fetch(served, ".mp4") == cached  # a copy fetched before is still served
        assert await cut.fetch(served, ".vtt") is None
        assert cut.stats.fetch_failed == 1
        for call in (cut.list(), cut.get(served), cut.delete(served)):
            with pytest.raises(ClipBucketError):
                await call
        assert await cut.enforce() == 0 and await cut.sweep() == 0
        assert cut.stats.maintenance_failed == 2

        own_nats.restart()
        await wait_until(lambda: client.is_connected, what="the client to reconnect")

        async def jetstream_answers() -> bool:  # it recovers its streams after the client is back
            try:
                await client.jetstream().stream_info("OBJ_clips-outage")
            except nats.errors.Error:
                return False
            return True

        await eventually(jetstream_answers, 30.0, "JetStream to answer after the restart")
        assert await bucket.put(sidecar(later), {".mp4": mp4})
        assert [c["clip_id"] for c in await bucket.list()] == [served, later]  # the stored clip survived
    finally:
        await client.close()


async def test_without_a_connection_put_returns_false_and_the_others_raise_clip_bucket_error(
    tmp_path: Path, mp4: Path
) -> None:
    publisher = NatsEventPublisher("nats://127.0.0.1:9", node="test")  # never connected
    bucket = ClipBucket(publisher, bucket="clips-x", max_bytes=1000, max_age_s=60.0, cache_dir=tmp_path / "c")
    assert not await bucket.put(sidecar(new_id()), {".mp4": mp4})
    assert bucket.stats.upload_failed == 1
    assert await bucket.fetch(new_id(), ".mp4") is None and bucket.stats.fetch_failed == 1
    with pytest.raises(ClipBucketError, match="not connected"):
        await bucket.list()


async def test_the_cache_holds_at_most_cache_max_bytes_least_recently_served_going_first(
    nc: NatsClient, tmp_path: Path, mp4: Path
) -> None:
    name = unique_bucket()
    size = len(read(mp4))
    bucket = bucket_for(nc, tmp_path, name, cache_max_bytes=int(size * 1.5))
    a, b, c = new_id(), new_id(), new_id()
    for clip_id in (a, b, c):
        assert await bucket.put(sidecar(clip_id), {".mp4": mp4})
    path_a = await bucket.fetch(a, ".mp4")
    path_b = await bucket.fetch(b, ".mp4")
    assert path_a is not None and path_b is not None
    assert not path_a.exists() and path_b.exists() and bucket.stats.cache_evicted == 1
    assert await bucket.fetch(b, ".mp4") == path_b and bucket.stats.cache_hits == 1
    assert await bucket.fetch(a, ".mp4") == path_a and path_a.exists() and not path_b.exists()
    assert (bucket.stats.fetched, bucket.stats.cache_evicted) == (3, 2)

    # Asked for twice at once: downloaded once.
    first, second = await asyncio.gather(bucket.fetch(c, ".mp4"), bucket.fetch(c, ".mp4"))
    assert first == second and first is not None and read(first) == read(mp4)
    assert bucket.stats.fetched == 4
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [f"{c}.mp4"]

    # A worker started again finds its cache on disk.
    again = bucket_for(nc, tmp_path, name, cache_max_bytes=int(size * 1.5))
    assert await again.fetch(c, ".mp4") == first
    assert (again.stats.cache_hits, again.stats.fetched) == (1, 0)


@pytest.mark.parametrize("clip_id", [
    "../../etc/passwd", "A" * 32, "0" * 31, "0" * 33, "0" * 32 + "\n", "0" * 31 + "/", "", "0" * 30 + "..",
])
async def test_a_hostile_clip_id_is_refused_before_any_name_or_path_is_built(
    clip_id: str, tmp_path: Path, mp4: Path
) -> None:
    bucket = ClipBucket(NatsClient(), bucket="clips-x", max_bytes=1000, max_age_s=60.0, cache_dir=tmp_path / "c")
    for call in (bucket.fetch(clip_id, ".mp4"), bucket.get(clip_id), bucket.delete(clip_id),
                 bucket.put({"clip_id": clip_id}, {".mp4": mp4})):
        with pytest.raises(ValueError, match="not a clip id"):
            await call
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("suffix", [".json", "/../x", ".mp4/..", "", ".MP4", ".vtt\n", "/etc/passwd"])
async def test_a_hostile_suffix_is_refused(suffix: str, tmp_path: Path, mp4: Path) -> None:
    bucket = ClipBucket(NatsClient(), bucket="clips-x", max_bytes=1000, max_age_s=60.0, cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="suffix"):
        await bucket.fetch(new_id(), suffix)
    with pytest.raises(ValueError, match="suffix"):
        await bucket.put(sidecar(new_id()), {".mp4": mp4, suffix: mp4})
    with pytest.raises(ValueError, match=r"needs its \.mp4"):
        await bucket.put(sidecar(new_id()), {".vtt": mp4})
    with pytest.raises(ValueError, match="created_at"):
        await bucket.put({"clip_id": new_id()}, {".mp4": mp4})
    assert not (tmp_path / "c").exists()


def test_the_bucket_is_named_like_the_fleets_other_buckets() -> None:
    assert clip_bucket_name("edge-1") == "vidsentry-fleet-edge-1-clips"
    with pytest.raises(ValueError):
        clip_bucket_name("no.dots")
    with pytest.raises(ValueError, match="bucket name"):
        ClipBucket(NatsClient(), bucket="a.b", max_bytes=1, max_age_s=1.0, cache_dir=Path("unused"))
