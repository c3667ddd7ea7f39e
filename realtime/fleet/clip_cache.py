"""ClipCache: one worker's local copies of the files it served from the fleet's clip bucket.

Why. `ClipBucket.fetch` (realtime.fleet.clip_bucket) copies an object into `directory` and serves
from there, so HTTP responses read a local file and a file asked for again is not fetched again.
Many asking for one file at once share one download. A copy is written under a temporary name and
renamed once nats-py has checked its digest and its size is the object's: a file in the directory
is whole, and clips never change, so a copy is served even while the bucket cannot be read. A
download cut short leaves a `.<name>.part`, removed when the directory is next read.

Bound. The cache holds at most `max_bytes`, least recently served first out; the file just fetched
always stays. The order is kept in the files' mtimes, touched on each hit, so it survives a
restart: the index is read from the directory on first use. The cache belongs to one worker (one
directory per process); a file removed behind its back is forgotten when next asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from nats.js.object_store import ObjectStore

from engines.media.files import replacing
from pipelines.tasks import TaskOwner
from realtime.fleet.clip_objects import SUFFIXES, ClipBucketError, ClipBucketStats, split_name

log = logging.getLogger("realtime.fleet.clip_bucket")  # the clip bucket's log, under the name it always had

Load = Callable[[], Coroutine[Any, Any, Path | None]]


class ClipCache:
    """Cached clip files in `directory`, at most `max_bytes` of them (see the module docstring).
    Counts `fetched`, `cache_hits` and `cache_evicted` in the bucket's `stats`."""

    def __init__(self, directory: Path, *, max_bytes: int, fetch_timeout_s: float, stats: ClipBucketStats) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.fetch_timeout_s = float(fetch_timeout_s)
        self.stats = stats
        self._inflight: dict[str, asyncio.Future[Path | None]] = {}  # file name -> its download
        self._entries: OrderedDict[str, int] | None = None  # file name -> bytes, least recently served first
        self._bytes = 0
        self._downloads = TaskOwner("clip cache")  # one per file, shared by whoever asks for it

    def path(self, name: str) -> Path:
        return self.directory / name

    async def once(self, name: str, load: Load) -> Path | None:
        """`load()`'s result, one run per file however many ask at once."""
        download = self._inflight.get(name)
        if download is None:
            download = self._downloads.spawn(load(), f"clip-download-{name}", awaited=True)
            self._inflight[name] = download
            download.add_done_callback(lambda _: self._inflight.pop(name, None))
        return await asyncio.shield(download)  # a caller that gives up leaves it to the others

    def size(self, name: str) -> int | None:
        """The cached file's size; None when it is not cached."""
        index = self._index()
        size = index.get(name)
        if size is not None and not self.path(name).is_file():
            self._forget(name)  # removed behind our back
            return None
        return size

    def hit(self, name: str) -> Path:
        """Serve a cached file: it becomes the most recently served."""
        self._index().move_to_end(name)
        with contextlib.suppress(OSError):
            os.utime(self.path(name))  # so the order survives a restart
        self.stats.cache_hits += 1
        return self.path(name)

    async def download(self, store: ObjectStore, name: str, size: int) -> None:
        """Copy an object of `size` bytes into the cache; it is served once `admit`ted."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with replacing(self.path(name)) as tmp:
            out = await asyncio.to_thread(tmp.open, "wb")
            with out:
                # nats-py waits for chunks without a limit (an object whose chunks are gone would hang),
                # and on a timeout leaves its chunk subscription behind: rare, and bounded here.
                async with asyncio.timeout(self.fetch_timeout_s):
                    await store.get(name, writeinto=out)
            got = tmp.stat().st_size
            if got != size:
                raise ClipBucketError(f"{name}: {got} of {size} bytes")

    def admit(self, name: str, size: int) -> Path:
        """Count a file just downloaded in, and the least recently served out past `max_bytes`."""
        self.stats.fetched += 1
        index = self._index()
        self._forget(name)
        index[name] = size
        self._bytes += size
        while self._bytes > self.max_bytes and len(index) > 1:  # never the file just fetched
            oldest = next(iter(index))
            self._forget(oldest)
            self.path(oldest).unlink(missing_ok=True)
            self.stats.cache_evicted += 1
        return self.path(name)

    def drop(self, clip_id: str) -> None:
        """Remove a clip's cached files (it is gone from the bucket)."""
        for suffix in SUFFIXES:
            self._forget(clip_id + suffix)
            try:
                self.path(clip_id + suffix).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cached clip file not removed", extra={"clip_id": clip_id, "error": str(exc)})

    def _index(self) -> OrderedDict[str, int]:
        """What the cache holds, read from the directory on first use (oldest served first)."""
        if self._entries is None:
            entries: list[tuple[float, str, int]] = []
            if self.directory.is_dir():
                for path in self.directory.iterdir():
                    if path.name.startswith(".") and path.name.endswith(".part"):
                        path.unlink(missing_ok=True)  # a download cut short
                    elif path.is_file() and split_name(path.name)[0] is not None:
                        stat = path.stat()
                        entries.append((stat.st_mtime, path.name, stat.st_size))
            self._entries = OrderedDict((name, size) for _, name, size in sorted(entries))
            self._bytes = sum(self._entries.values())
        return self._entries

    def _forget(self, name: str) -> None:
        size = self._index().pop(name, None)
        if size is not None:
            self._bytes -= size
