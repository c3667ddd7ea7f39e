"""ClipCache alone, without NATS: the bound and its order (kept across a restart), what a restart
finds on disk, a download that is short or cut, and one load per file however many ask."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest
from nats.js.object_store import ObjectStore

from realtime.fleet.clip_cache import ClipCache
from realtime.fleet.clip_objects import ClipBucketError, ClipBucketStats


def cache_in(directory: Path, max_bytes: int = 100) -> ClipCache:
    return ClipCache(directory, max_bytes=max_bytes, fetch_timeout_s=5.0, stats=ClipBucketStats())


def new_id() -> str:
    return uuid.uuid4().hex


class FakeStore:
    """Writes `body` for any object (what nats-py's get(writeinto=) does once the digest checks out)."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def get(self, name: str, writeinto: BinaryIO) -> Any:
        writeinto.write(self.body)


async def downloaded(cache: ClipCache, name: str, body: bytes) -> Path:
    await cache.download(cast(ObjectStore, FakeStore(body)), name, len(body))
    return cache.admit(name, len(body))


async def test_past_its_bound_the_least_recently_served_file_goes_but_never_the_one_just_fetched(
    tmp_path: Path,
) -> None:
    cache = cache_in(tmp_path / "c", max_bytes=100)
    a, b, c = (new_id() + ".mp4" for _ in range(3))
    path_a = await downloaded(cache, a, b"a" * 40)
    path_b = await downloaded(cache, b, b"b" * 40)
    assert cache.size(a) == 40 and cache.hit(a) == path_a  # a is now the most recently served
    path_c = await downloaded(cache, c, b"c" * 40)
    assert path_a.exists() and not path_b.exists() and path_c.exists()
    assert (cache.stats.fetched, cache.stats.cache_hits, cache.stats.cache_evicted) == (3, 1, 1)
    assert cache.size(b) is None

    huge = new_id() + ".vtt"
    path_huge = await downloaded(cache, huge, b"h" * 150)
    assert path_huge.exists() and sorted(p.name for p in (tmp_path / "c").iterdir()) == [huge]
    assert cache.stats.cache_evicted == 3


async def test_a_restart_finds_the_cache_on_disk_in_its_served_order_and_drops_what_is_not_a_whole_clip_file(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "c"
    directory.mkdir()
    older, newer = new_id() + ".mp4", new_id() + ".boxes.json"
    (directory / older).write_bytes(b"o" * 40)
    (directory / newer).write_bytes(b"n" * 40)
    os.utime(directory / older, (1000, 1000))
    os.utime(directory / newer, (2000, 2000))
    (directory / f".{new_id()}.mp4.part").write_bytes(b"cut")
    (directory / "notes.txt").write_bytes(b"not ours")

    cache = cache_in(directory, max_bytes=100)
    assert cache.size(older) == 40 and cache.size(newer) == 40
    assert not list(directory.glob(".*.part")) and (directory / "notes.txt").exists()
    await downloaded(cache, new_id() + ".mp4", b"x" * 40)
    assert not (directory / older).exists() and (directory / newer).exists()  # the older mtime went first

    (directory / newer).unlink()  # removed behind its back: forgotten when next asked for
    assert cache.size(newer) is None


async def test_a_short_download_leaves_no_file_and_drop_removes_every_file_of_a_clip(tmp_path: Path) -> None:
    cache = cache_in(tmp_path / "c")
    clip_id = new_id()
    with pytest.raises(ClipBucketError, match="3 of 4 bytes"):
        await cache.download(cast(ObjectStore, FakeStore(b"abc")), clip_id + ".mp4", 4)
    assert not list((tmp_path / "c").iterdir())

    await downloaded(cache, clip_id + ".mp4", b"m" * 10)
    await downloaded(cache, clip_id + ".vtt", b"v" * 10)
    cache.drop(clip_id)
    assert not list((tmp_path / "c").iterdir())
    assert cache.size(clip_id + ".mp4") is None and cache.size(clip_id + ".vtt") is None


async def test_many_asking_for_one_file_at_once_share_one_load(tmp_path: Path) -> None:
    cache = cache_in(tmp_path / "c")
    name = new_id() + ".mp4"
    runs = 0
    release = asyncio.Event()

    async def load() -> Path | None:
        nonlocal runs
        runs += 1
        await release.wait()
        return cache.path(name)

    waiting = [asyncio.ensure_future(cache.once(name, load)) for _ in range(3)]
    await asyncio.sleep(0)
    waiting[0].cancel()  # a caller that gives up leaves the load to the others
    release.set()
    assert await asyncio.gather(*waiting[1:]) == [cache.path(name)] * 2
    assert runs == 1
    await cache.once(name, load)  # done: a later ask runs it again
    assert runs == 2
