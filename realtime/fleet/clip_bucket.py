"""ClipBucket: a fleet's finished clips in one JetStream object store bucket.

Why. A clip is written by the worker that runs its stream, on that worker's disk
(pipelines/clips/store.py). In a fleet the stream moves when its worker dies or drains, and any
worker's HTTP API may be asked for any clip. So each finished clip is also uploaded to the fleet's
bucket (`clip_bucket_name`): any worker lists and serves it, and what a worker had uploaded
outlives it.

Layout. One object per file, named like the local files: `<id>.mp4`, `<id>.boxes.json`, `<id>.vtt`,
`<id>.events.json`. The extras go up first and the MP4 last; the MP4 object's description holds the
clip's sidecar (`ClipInfo.sidecar()`, compact JSON), so one listing of the bucket gives every clip's
metadata without a GET per clip, and a clip exists for readers exactly when its MP4 object does
(names and listing: realtime.fleet.clip_objects).

Unfinished uploads. nats-py publishes an object's chunks on a fresh subject and its meta message
last; an upload stopped before that meta (SIGKILL, a cut connection, a cancelled task) leaves an
object that `list`, `get_info` and `get` do not know: it is never listed nor served. What it leaves
is swept by `sweep()`. A worker that restarts with the clip still on its disk calls `put` again,
which finishes it (a clip already there is left alone).

Outages. `put` returns False and `fetch` None, counted and logged as one warning line, when NATS is
not connected, times out or answers with an error: a stream never fails for its clips. `list`,
`get` and `delete` raise `ClipBucketError` then, so the API can tell "no such clip" from "cannot
say now" (503).

The parts. This class is the bucket itself: its connection, uploads, listing, reads and deletes,
and the counters. Retention, room for a put and the sweep are `ClipRetention`
(realtime.fleet.clip_retention); the local copies `fetch` serves from are `ClipCache`
(realtime.fleet.clip_cache). All three count in one `ClipBucketStats`.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta, StorageType
from nats.js.errors import APIError, ObjectNotFoundError
from nats.js.object_store import OBJ_DEFAULT_CHUNK_SIZE, ObjectStore

from pipelines.capability import Sample
from pipelines.clips.store import EXTRAS
from realtime.bus.object_buckets import BucketLimitsRefused, open_object_bucket
from realtime.bus.publisher import NatsEventPublisher, live_client
from realtime.fleet.clip_cache import ClipCache
from realtime.fleet.clip_objects import (
    MP4,
    OUTAGE,
    OUTAGE_OR_DISK,
    SUFFIXES,
    ClipBucketError,
    ClipBucketStats,
    Sidecars,
    is_time,
    list_clips,
    object_name,
    reason,
    sidecar_of,
)
from realtime.fleet.clip_retention import BACKSTOP_GRACE_S, ClipRetention
from realtime.leases.records import check_fleet_name

log = logging.getLogger(__name__)

DEFAULT_CACHE_MAX_BYTES = 1024**3
DEFAULT_ORPHAN_AGE_S = 600.0  # far longer than any upload takes
DEFAULT_REQUEST_TIMEOUT_S = 5.0  # each JetStream request (one chunk, one meta, one info)
DEFAULT_FETCH_TIMEOUT_S = 120.0  # one whole object into the cache
MAX_SIDECAR_BYTES = 64 * 1024  # the sidecar rides in a meta message, which must fit one NATS payload
_MAX_BYTES_EXCEEDED = 10077  # JetStream err_code: the stream is at max_bytes
# What JetStream counts beyond the payload (subject, headers, framing): an estimate on the safe side.
_CHUNK_OVERHEAD = 128
_META_OVERHEAD = 1024
_CONTENT_TYPES = {MP4: "video/mp4", ".boxes.json": "application/json", ".vtt": "text/vtt",
                  ".events.json": "application/json"}


def clip_bucket_name(fleet: str) -> str:
    """The fleet's clip bucket, named like its other buckets (records.py, buckets.py)."""
    return f"vidsentry-fleet-{check_fleet_name(fleet)}-clips"


class ClipBucket:
    """Clips in a JetStream object store bucket (see the module docstring).

    Give it a connected nats-py client, or the service's `NatsEventPublisher` to share its
    connection (looked up on each call: the publisher may connect after this is built). The
    bucket is created on first use, or its limits brought to `max_bytes` / `max_age_s`.
    """

    def __init__(
        self,
        nc_or_publisher: NatsClient | NatsEventPublisher,
        *,
        bucket: str,
        max_bytes: int,
        max_age_s: float,
        cache_dir: Path,
        cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
        storage: StorageType = StorageType.FILE,
        replicas: int = 1,
        orphan_age_s: float = DEFAULT_ORPHAN_AGE_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S,
    ) -> None:
        if not bucket or not all(c.isascii() and (c.isalnum() or c in "-_") for c in bucket):
            raise ValueError(f"bucket name {bucket!r}: use A-Z a-z 0-9 _ -")
        if max_bytes < 1 or cache_max_bytes < 1:
            raise ValueError("max_bytes and cache_max_bytes must be >= 1")
        if max_age_s <= 0 or orphan_age_s < 0 or request_timeout_s <= 0 or fetch_timeout_s <= 0:
            raise ValueError("max_age_s and the timeouts must be > 0, orphan_age_s >= 0")
        self._source = nc_or_publisher
        self.source = nc_or_publisher  # whose connection other users of the fleet's NATS share
        self.bucket = bucket
        self.storage = storage
        self.replicas = replicas
        self.request_timeout_s = float(request_timeout_s)
        self.stats = ClipBucketStats()
        self._handles: tuple[NatsClient, JetStreamContext, ObjectStore] | None = None
        self._lock = asyncio.Lock()
        self.cache = ClipCache(cache_dir, max_bytes=cache_max_bytes, fetch_timeout_s=fetch_timeout_s,
                               stats=self.stats)
        self.retention = ClipRetention(bucket, max_bytes=max_bytes, max_age_s=max_age_s, orphan_age_s=orphan_age_s,
                                       connect=self._connect, cache=self.cache, stats=self.stats)

    # Settings, each held once, by the part it belongs to.

    @property
    def max_bytes(self) -> int:
        return self.retention.max_bytes

    @property
    def max_age_s(self) -> float:
        return self.retention.max_age_s

    @property
    def orphan_age_s(self) -> float:
        return self.retention.orphan_age_s

    @property
    def cache_dir(self) -> Path:
        return self.cache.directory

    @property
    def cache_max_bytes(self) -> int:
        return self.cache.max_bytes

    @property
    def fetch_timeout_s(self) -> float:
        return self.cache.fetch_timeout_s

    @property
    def stream_max_age_s(self) -> float:
        return self.retention.stream_max_age_s

    # -- writing --------------------------------------------------------------------------------

    async def put(self, sidecar: Mapping[str, Any], files: Mapping[str, Path]) -> bool:
        """Upload one finished clip: `files` maps suffix -> local path (".mp4" required, the others
        from EXTRAS). True once the clip is in the bucket (or was already); False, counted and
        logged, when it could not be stored. ValueError for a malformed call."""
        clip_id = str(sidecar.get("clip_id", ""))
        object_name(clip_id, MP4)
        if not is_time(sidecar.get("created_at")):
            raise ValueError(f"sidecar of clip {clip_id} has no created_at")  # retention and listing order need it
        if MP4 not in files:
            raise ValueError("a clip needs its .mp4")
        unknown = sorted(set(files) - set(SUFFIXES))
        if unknown:
            raise ValueError(f"not clip file suffixes: {unknown}")
        extras = [suffix for suffix in EXTRAS if suffix in files]
        # The listing tells readers which extras exist: what is uploaded, whatever the sidecar said.
        description = json.dumps({**sidecar, "extras": extras}, separators=(",", ":"))
        if len(description.encode()) > MAX_SIDECAR_BYTES:
            raise ValueError(f"sidecar of clip {clip_id} is over {MAX_SIDECAR_BYTES} bytes")
        # The MP4 last: its object lists the clip, so readers never see one without its extras.
        uploads = [(suffix, files[suffix]) for suffix in extras] + [(MP4, files[MP4])]
        try:
            await self._put(clip_id, description, uploads)
        except OUTAGE_OR_DISK as exc:
            self._handles = None  # looked up again next time (the bucket may have been deleted meanwhile)
            self.stats.upload_failed += 1
            log.warning("clip not uploaded", extra={"clip_id": clip_id, "bucket": self.bucket, "error": reason(exc)})
            return False
        return True

    async def _put(self, clip_id: str, description: str, uploads: Sequence[tuple[str, Path]]) -> None:
        _, store = await self._connect()
        try:
            await store.get_info(clip_id + MP4)
            return  # uploaded before (put again after a restart): the MP4 comes last, so the clip is whole
        except ObjectNotFoundError:
            pass
        done, retried = 0, False
        while done < len(uploads):
            suffix, path = uploads[done]
            name = clip_id + suffix
            meta = ObjectMeta(name=name, description=description if suffix == MP4 else None,
                              headers={"Content-Type": _CONTENT_TYPES[suffix]})
            reader = await asyncio.to_thread(_open_upload, path)
            try:
                with reader:
                    # nats-py reads a file object in 128 KiB chunks in a thread, publishing each:
                    # a clip is never read into memory whole.
                    await store.put(name, reader, meta=meta)
            except APIError as exc:
                if exc.err_code != _MAX_BYTES_EXCEEDED or retried:
                    raise
                retried = True  # nats-py purged the refused object's chunks; the earlier files stay
                needed = sum(_stored_estimate(p.stat().st_size, len(description)) for _, p in uploads[done:])
                if not await self.retention.make_room(needed, keep=clip_id):
                    raise ClipBucketError(f"clip of {needed} bytes cannot fit bucket of {self.max_bytes}") from None
                continue
            done += 1
        self.stats.uploaded += 1

    # -- reading --------------------------------------------------------------------------------

    async def list(self, stream_id: str | None = None) -> Sidecars:
        """Every listed clip's sidecar, oldest first (one listing of the bucket, no per-clip GET)."""
        try:
            _, store = await self._connect()
            clips = await list_clips(store)
        except OUTAGE as exc:
            raise ClipBucketError(f"clip bucket {self.bucket}: {reason(exc)}") from None
        return [c for c in clips if stream_id is None or c.get("stream_id") == stream_id]

    async def get(self, clip_id: str) -> dict[str, Any] | None:
        """One clip's sidecar; None when the bucket does not list it."""
        name = object_name(clip_id, MP4)
        try:
            _, store = await self._connect()
            info = await store.get_info(name)
        except ObjectNotFoundError:
            return None
        except OUTAGE as exc:
            raise ClipBucketError(f"clip bucket {self.bucket}: {reason(exc)}") from None
        return sidecar_of(info)

    async def fetch(self, clip_id: str, suffix: str) -> Path | None:
        """A listed clip's file, copied into `cache_dir` (or the copy already there). None when the
        clip or that extra is not in the bucket, or it cannot be read now (counted, logged)."""
        name = object_name(clip_id, suffix)
        return await self.cache.once(name, lambda: self._fetch(clip_id, suffix))

    async def _fetch(self, clip_id: str, suffix: str) -> Path | None:
        name = clip_id + suffix
        cache = self.cache
        try:
            _, store = await self._connect()
            try:
                info = await store.get_info(clip_id + MP4)  # listed: the MP4 came last, so the clip is whole
            except ObjectNotFoundError:
                cache.drop(clip_id)  # gone from the bucket (retention, delete): so go its copies
                return None
            if suffix != MP4:
                body = sidecar_of(info)
                if body is None or suffix not in body.get("extras", ()):
                    return None
                info = await store.get_info(name)
            size = info.size or 0
            if cache.size(name) == size:
                return cache.hit(name)
            await cache.download(store, name, size)
        except ObjectNotFoundError:
            return None  # removed meanwhile
        except OUTAGE_OR_DISK as exc:
            if cache.size(name) is not None:  # a copy fetched before is whole, and clips never change
                return cache.hit(name)
            self.stats.fetch_failed += 1
            log.warning("clip file not fetched", extra={"clip_id": clip_id, "suffix": suffix, "bucket": self.bucket,
                                                        "error": reason(exc)})
            return None
        return cache.admit(name, size)

    # -- removing -------------------------------------------------------------------------------

    async def delete(self, clip_id: str) -> bool:
        """Remove all of a clip's objects and its cached files; False when the bucket had none."""
        object_name(clip_id, MP4)
        self.cache.drop(clip_id)
        try:
            js, store = await self._connect()
            return await self.retention.remove(js, store, clip_id)
        except OUTAGE as exc:
            raise ClipBucketError(f"clip bucket {self.bucket}: {reason(exc)}") from None

    async def enforce(self, now: float | None = None) -> int:
        """Delete clips past `max_age_s`, then the oldest while the bucket holds more than
        `max_bytes` (the newest stays). Returns how many were deleted; an outage is logged."""
        return await self.retention.enforce(now)

    async def sweep(self, now: float | None = None) -> int:
        """Remove what unfinished uploads left, once older than `orphan_age_s`. Returns how many;
        an outage is logged."""
        return await self.retention.sweep(now)

    # -- the bucket -----------------------------------------------------------------------------

    def _client(self) -> NatsClient:
        nc = live_client(self._source)
        if nc is None:
            raise ClipBucketError("NATS is not connected")
        return nc

    async def _connect(self) -> tuple[JetStreamContext, ObjectStore]:
        nc = self._client()
        handles = self._handles
        if handles is None or handles[0] is not nc:
            async with self._lock:  # concurrent first calls create the bucket once
                if self._handles is None or self._handles[0] is not nc:
                    js = nc.jetstream(timeout=self.request_timeout_s)
                    self._handles = (nc, js, await self._ensure_bucket(js))
                handles = self._handles
        return handles[1], handles[2]

    async def _ensure_bucket(self, js: JetStreamContext) -> ObjectStore:
        """The bucket, made or brought to this worker's limits (lowering max_bytes keeps what is
        stored, and `enforce()` brings it down)."""
        try:
            store, done = await open_object_bucket(
                js, self.bucket, description="vidsentry fleet clips", max_bytes=self.max_bytes,
                max_age_s=self.stream_max_age_s, storage=self.storage, replicas=self.replicas)
        except BucketLimitsRefused as exc:
            raise ClipBucketError(f"cannot set limits of clip bucket {self.bucket}: {exc}") from None
        if done != "kept":
            log.info("created clip bucket" if done == "created" else "updated clip bucket limits",
                     extra={"bucket": self.bucket, "max_bytes": self.max_bytes, "max_age_s": self.max_age_s})
        return store

    # -- metrics --------------------------------------------------------------------------------

    def samples(self) -> Iterable[Sample]:
        """The counters for /metrics."""
        yield from self.stats.samples()


def _open_upload(path: Path) -> io.BufferedReader:
    return path.open("rb")


def _stored_estimate(size: int, meta_bytes: int) -> int:
    """What one object of `size` bytes takes in the stream, its chunks' and meta's framing included."""
    chunks = max(1, math.ceil(size / OBJ_DEFAULT_CHUNK_SIZE))
    return size + chunks * _CHUNK_OVERHEAD + _META_OVERHEAD + meta_bytes


__all__ = [
    "BACKSTOP_GRACE_S", "MP4", "SUFFIXES", "ClipBucket", "ClipBucketError", "ClipBucketStats",
    "clip_bucket_name", "object_name",
]
