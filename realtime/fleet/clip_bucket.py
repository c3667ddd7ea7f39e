"""ClipBucket: a fleet's finished clips in one JetStream object store bucket.

Why. A clip is written by the worker that runs its stream, on that worker's disk
(pipelines/clips/store.py). In a fleet the stream moves when its worker dies or drains, and any
worker's HTTP API may be asked for any clip. So each finished clip is also uploaded to the fleet's
bucket (`clip_bucket_name`): any worker lists and serves it, and what a worker had uploaded
outlives it.

Layout. One object per file, named like the local files: `<id>.mp4`, `<id>.boxes.json`, `<id>.vtt`,
`<id>.events.json`. The extras go up first and the MP4 last; the MP4 object's description holds the
clip's sidecar (`ClipInfo.sidecar()`, compact JSON), so one listing of the bucket gives every clip's
metadata without a GET per clip, and a clip exists for readers exactly when its MP4 object does.

Unfinished uploads. nats-py publishes an object's chunks on a fresh subject and its meta message
last; an upload stopped before that meta (SIGKILL, a cut connection, a cancelled task) leaves an
object that `list`, `get_info` and `get` do not know: it is never listed nor served. It leaves
chunks that no meta points at, and maybe the clip's extras without its MP4; `sweep()` removes both
once older than `orphan_age_s` (an upload under way is younger). A worker that restarts with the
clip still on its disk calls `put` again, which finishes it (a clip already there is left alone).

Retention. The stream is capped at `max_bytes` with the discard-new policy nats-py gives object
stores: JetStream refuses a new chunk instead of dropping an old one, so a stored clip stays whole.
A `put` that finds the bucket full (err_code 10077) deletes the oldest clips to make room and tries
once more. `enforce()` deletes clips older than `max_age_s`, and the oldest while the bucket holds
more than `max_bytes` (after the limit was lowered JetStream keeps what it already holds). The
stream's own max age, `BACKSTOP_GRACE_S` past `max_age_s`, only matters when no worker runs
`enforce()`: it expires a clip's chunks a moment before its meta, where `enforce()` removes it whole.
A clip is removed by purging its metas, then its chunks: nats-py's delete() publishes a "deleted"
meta first, which a full bucket refuses after purging the chunks anyway (listed, nothing to serve).

Outages. `put` returns False and `fetch` None, counted and logged as one warning line, when NATS is
not connected, times out or answers with an error: a stream never fails for its clips. `list`,
`get` and `delete` raise `ClipBucketError` then, so the API can tell "no such clip" from "cannot
say now" (503). `enforce()` and `sweep()` log, count the run in `maintenance_failed` and return.

Serving. `fetch` copies an object into `cache_dir` (a temporary name renamed once nats-py has
checked its digest) and serves from there, so HTTP responses read a local file and a file asked for
again is not fetched again. The cache holds at most `cache_max_bytes`, least recently served first
out; it belongs to one worker (one `cache_dir` per process).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import ObjectInfo, ObjectMeta, StorageType
from nats.js.errors import APIError, NotFoundError, ObjectNotFoundError
from nats.js.object_store import (
    OBJ_ALL_CHUNKS_PRE_TEMPLATE,
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_DEFAULT_CHUNK_SIZE,
    OBJ_META_PRE_TEMPLATE,
    OBJ_STREAM_TEMPLATE,
    ObjectStore,
)

from engines.media.files import replacing
from pipelines.capability import Sample
from pipelines.clips.store import CLIP_ID, EXTRAS
from realtime.bus.object_buckets import BucketLimitsRefused, open_object_bucket
from realtime.bus.publisher import NatsEventPublisher, live_client
from realtime.fleet.records import check_fleet_name

log = logging.getLogger(__name__)

MP4 = ".mp4"
SUFFIXES = (MP4, *EXTRAS)  # the objects of one clip, the MP4 first (deleting it unlists the clip at once)
DEFAULT_CACHE_MAX_BYTES = 1024**3
DEFAULT_ORPHAN_AGE_S = 600.0  # far longer than any upload takes
DEFAULT_REQUEST_TIMEOUT_S = 5.0  # each JetStream request (one chunk, one meta, one info)
DEFAULT_FETCH_TIMEOUT_S = 120.0  # one whole object into the cache
LIST_TIMEOUT_S = 30.0  # one listing (a watch over every meta message)
BACKSTOP_GRACE_S = 3600.0  # the stream's max age is this past max_age_s
MAX_SIDECAR_BYTES = 64 * 1024  # the sidecar rides in a meta message, which must fit one NATS payload
_MAX_BYTES_EXCEEDED = 10077  # JetStream err_code: the stream is at max_bytes
# What JetStream counts beyond the payload (subject, headers, framing): an estimate on the safe side.
_CHUNK_OVERHEAD = 128
_META_OVERHEAD = 1024
_CONTENT_TYPES = {MP4: "video/mp4", ".boxes.json": "application/json", ".vtt": "text/vtt",
                  ".events.json": "application/json"}


class ClipBucketError(Exception):
    """The bucket cannot be read now (not connected, timed out, an error from JetStream), or its
    limits cannot be set. Raised by `list`, `get` and `delete`; `put` and `fetch` report the same
    as False / None."""


_OUTAGE: tuple[type[BaseException], ...] = (nats.errors.Error, TimeoutError, ClipBucketError)
_OUTAGE_OR_DISK: tuple[type[BaseException], ...] = (*_OUTAGE, OSError)
Sidecars = list[dict[str, Any]]  # (the class's own `list` hides the builtin in its annotations)


@dataclass(slots=True)
class ClipBucketStats:
    uploaded: int = 0
    upload_failed: int = 0  # NATS down, timed out, the bucket full even after eviction, the local file gone
    fetched: int = 0  # objects copied from the bucket into the cache
    fetch_failed: int = 0
    cache_hits: int = 0  # served from the cache without a download
    evicted_bytes: int = 0  # clips removed for the bucket's size (by enforce, or to make room for a put)
    evicted_age: int = 0  # clips removed for their age
    cache_evicted: int = 0  # cached files removed for the cache's bound
    orphans_removed: int = 0  # chunks of unfinished uploads and extras of clips whose MP4 never came
    maintenance_failed: int = 0  # enforce / sweep runs cut short by an outage


def clip_bucket_name(fleet: str) -> str:
    """The fleet's clip bucket, named like its other buckets (records.py, buckets.py)."""
    return f"vidsentry-fleet-{check_fleet_name(fleet)}-clips"


def object_name(clip_id: str, suffix: str) -> str:
    """`<id><suffix>`, only for a clip id and a known suffix (ValueError otherwise): names and
    cache paths are never built from anything else."""
    if not isinstance(clip_id, str) or not CLIP_ID.fullmatch(clip_id):
        raise ValueError(f"not a clip id: {clip_id!r}")
    if suffix not in SUFFIXES:
        raise ValueError(f"not a clip file suffix: {suffix!r}")
    return clip_id + suffix


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
        self.max_bytes = max_bytes
        self.max_age_s = float(max_age_s)
        self.cache_dir = Path(cache_dir)
        self.cache_max_bytes = cache_max_bytes
        self.storage = storage
        self.replicas = replicas
        self.orphan_age_s = float(orphan_age_s)
        self.request_timeout_s = float(request_timeout_s)
        self.fetch_timeout_s = float(fetch_timeout_s)
        self.stats = ClipBucketStats()
        self._stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket)
        self._handles: tuple[NatsClient, JetStreamContext, ObjectStore] | None = None
        self._lock = asyncio.Lock()
        self._inflight: dict[str, asyncio.Future[Path | None]] = {}  # object name -> its download
        self._cache: OrderedDict[str, int] | None = None  # cached file name -> bytes, least recently served first
        self._cache_bytes = 0

    @property
    def stream_max_age_s(self) -> float:
        return self.max_age_s + BACKSTOP_GRACE_S

    # -- writing --------------------------------------------------------------------------------

    async def put(self, sidecar: Mapping[str, Any], files: Mapping[str, Path]) -> bool:
        """Upload one finished clip: `files` maps suffix -> local path (".mp4" required, the others
        from EXTRAS). True once the clip is in the bucket (or was already); False, counted and
        logged, when it could not be stored. ValueError for a malformed call."""
        clip_id = str(sidecar.get("clip_id", ""))
        object_name(clip_id, MP4)
        if not _is_time(sidecar.get("created_at")):
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
        except _OUTAGE_OR_DISK as exc:
            self._handles = None  # looked up again next time (the bucket may have been deleted meanwhile)
            self.stats.upload_failed += 1
            log.warning("clip not uploaded", extra={"clip_id": clip_id, "bucket": self.bucket, "error": _reason(exc)})
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
                if not await self._make_room(needed, keep=clip_id):
                    raise ClipBucketError(f"clip of {needed} bytes cannot fit bucket of {self.max_bytes}") from None
                continue
            done += 1
        self.stats.uploaded += 1

    async def _make_room(self, needed: int, *, keep: str) -> bool:
        """Delete the oldest clips until `needed` more bytes fit under the stream's limit; False when
        they never can (a clip larger than the bucket, or a stream without a byte limit)."""
        js, store = await self._connect()
        status = await store.status()
        limit = status.stream_info.config.max_bytes or -1
        if limit < 0 or needed > limit:
            return False
        used = status.size
        for clip in await self._clips(store):
            if used + needed <= limit:
                break
            if clip["clip_id"] == keep:
                continue
            if await self._remove(js, store, clip["clip_id"]):
                self.stats.evicted_bytes += 1
                log.info("clip evicted to make room", extra={"clip_id": clip["clip_id"], "bucket": self.bucket})
            used = (await store.status()).size
        return True  # the retry says whether it fits (the sizes here are estimates)

    # -- reading --------------------------------------------------------------------------------

    async def list(self, stream_id: str | None = None) -> Sidecars:
        """Every listed clip's sidecar, oldest first (one listing of the bucket, no per-clip GET)."""
        try:
            _, store = await self._connect()
            clips = await self._clips(store)
        except _OUTAGE as exc:
            raise ClipBucketError(f"clip bucket {self.bucket}: {_reason(exc)}") from None
        return [c for c in clips if stream_id is None or c.get("stream_id") == stream_id]

    async def get(self, clip_id: str) -> dict[str, Any] | None:
        """One clip's sidecar; None when the bucket does not list it."""
        name = object_name(clip_id, MP4)
        try:
            _, store = await self._connect()
            info = await store.get_info(name)
        except ObjectNotFoundError:
            return None
        except _OUTAGE as exc:
            raise ClipBucketError(f"clip bucket {self.bucket}: {_reason(exc)}") from None
        return _sidecar(info)

    async def fetch(self, clip_id: str, suffix: str) -> Path | None:
        """A listed clip's file, copied into `cache_dir` (or the copy already there). None when the
        clip or that extra is not in the bucket, or it cannot be read now (counted, logged)."""
        name = object_name(clip_id, suffix)
        download = self._inflight.get(name)
        if download is None:  # one download per file, however many ask at once
            download = asyncio.ensure_future(self._fetch(clip_id, suffix))
            self._inflight[name] = download
            download.add_done_callback(lambda _: self._inflight.pop(name, None))
        return await asyncio.shield(download)  # a caller that gives up leaves it to the others

    async def _fetch(self, clip_id: str, suffix: str) -> Path | None:
        name = clip_id + suffix
        path = self.cache_dir / name
        try:
            _, store = await self._connect()
            try:
                info = await store.get_info(clip_id + MP4)  # listed: the MP4 came last, so the clip is whole
            except ObjectNotFoundError:
                self._drop_cached(clip_id)  # gone from the bucket (retention, delete): so go its copies
                return None
            if suffix != MP4:
                body = _sidecar(info)
                if body is None or suffix not in body.get("extras", ()):
                    return None
                info = await store.get_info(name)
            size = info.size or 0
            if self._cached(name) == size:
                self._touch(name)
                self.stats.cache_hits += 1
                return path
            await self._download(store, name, path, size)
        except ObjectNotFoundError:
            return None  # removed meanwhile
        except _OUTAGE_OR_DISK as exc:
            if self._cached(name) is not None:  # a copy fetched before is whole, and clips never change
                self._touch(name)
                self.stats.cache_hits += 1
                return path
            self.stats.fetch_failed += 1
            log.warning("clip file not fetched", extra={"clip_id": clip_id, "suffix": suffix, "bucket": self.bucket,
                                                        "error": _reason(exc)})
            return None
        self.stats.fetched += 1
        self._admit(name, size)
        return path

    async def _download(self, store: ObjectStore, name: str, path: Path, size: int) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            out = await asyncio.to_thread(tmp.open, "wb")
            with out:
                # nats-py waits for chunks without a limit (an object whose chunks are gone would hang),
                # and on a timeout leaves its chunk subscription behind: rare, and bounded here.
                async with asyncio.timeout(self.fetch_timeout_s):
                    await store.get(name, writeinto=out)
            got = tmp.stat().st_size
            if got != size:
                raise ClipBucketError(f"{name}: {got} of {size} bytes")

    # -- removing -------------------------------------------------------------------------------

    async def delete(self, clip_id: str) -> bool:
        """Remove all of a clip's objects and its cached files; False when the bucket had none."""
        object_name(clip_id, MP4)
        self._drop_cached(clip_id)
        try:
            js, store = await self._connect()
            return await self._remove(js, store, clip_id)
        except _OUTAGE as exc:
            raise ClipBucketError(f"clip bucket {self.bucket}: {_reason(exc)}") from None

    async def enforce(self, now: float | None = None) -> int:
        """Delete clips past `max_age_s`, then the oldest while the bucket holds more than
        `max_bytes` (the newest stays). Returns how many were deleted; an outage is logged."""
        now = time.time() if now is None else now
        removed = 0
        try:
            js, store = await self._connect()
            kept: Sidecars = []
            for clip in await self._clips(store):
                if now - clip["created_at"] <= self.max_age_s:
                    kept.append(clip)
                elif await self._remove(js, store, clip["clip_id"]):
                    self.stats.evicted_age += 1
                    removed += 1
            used = (await store.status()).size
            while used > self.max_bytes and len(kept) > 1:
                oldest = kept.pop(0)
                if await self._remove(js, store, oldest["clip_id"]):
                    self.stats.evicted_bytes += 1
                    removed += 1
                used = (await store.status()).size
        except _OUTAGE as exc:
            self.stats.maintenance_failed += 1
            log.warning("clip retention not applied", extra={"bucket": self.bucket, "error": _reason(exc)})
        return removed

    async def sweep(self, now: float | None = None) -> int:
        """Remove what unfinished uploads left, once older than `orphan_age_s`: extras of a clip whose
        MP4 never came, and chunks no object points at. Returns how many; an outage is logged."""
        now = time.time() if now is None else now
        removed = 0
        try:
            js, store = await self._connect()
            objects = await self._objects(store)
            clips = {o.name[:-len(MP4)] for o in objects if _split(o.name)[1] == MP4}
            for obj in objects:
                clip_id, suffix = _split(obj.name)
                if clip_id is None or suffix == MP4 or clip_id in clips or _age(obj, now) <= self.orphan_age_s:
                    continue
                if await self._remove_object(js, store, obj.name):
                    removed += 1
            # Chunks on subjects no meta names: an upload cut before its meta (nats-py purges them
            # on an error it sees, not on a kill or a cancel). One in progress has a fresh last chunk.
            live = {o.nuid for o in objects}
            chunks = OBJ_ALL_CHUNKS_PRE_TEMPLATE.format(bucket=self.bucket)
            prefix = chunks[:-1]
            info = await js.stream_info(self._stream, subjects_filter=chunks)
            for subject in info.state.subjects or {}:
                if subject[len(prefix):] in live:
                    continue
                last = await js.get_last_msg(self._stream, subject)
                if last.time is None or now - last.time.timestamp() <= self.orphan_age_s:
                    continue
                await js.purge_stream(self._stream, subject=subject)
                removed += 1
        except _OUTAGE as exc:
            self.stats.maintenance_failed += 1
            log.warning("clip bucket sweep cut short", extra={"bucket": self.bucket, "error": _reason(exc)})
        self.stats.orphans_removed += removed
        return removed

    async def _remove(self, js: JetStreamContext, store: ObjectStore, clip_id: str) -> bool:
        """Delete a clip's objects, the MP4 first (the clip is unlisted from then on)."""
        found = False
        for suffix in SUFFIXES:
            found = await self._remove_object(js, store, clip_id + suffix) or found
        self._drop_cached(clip_id)
        return found

    async def _remove_object(self, js: JetStreamContext, store: ObjectStore, name: str) -> bool:
        """Purge an object's meta (it is unlisted at once), then its chunks. Not nats-py's delete():
        that publishes a "deleted" meta first, which a full bucket refuses (10077), and then purges
        the chunks anyway: the object would stay listed with nothing to serve, exactly when
        retention must make room. A crash between the two purges leaves chunks for `sweep()`."""
        try:
            info = await store.get_info(name)
        except ObjectNotFoundError:
            return False  # never there, or another worker removed it first
        meta = OBJ_META_PRE_TEMPLATE.format(bucket=self.bucket, obj=base64.urlsafe_b64encode(name.encode()).decode())
        await js.purge_stream(self._stream, subject=meta)
        if info.nuid:
            await js.purge_stream(self._stream, subject=OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=self.bucket,
                                                                                      obj=info.nuid))
        return True

    # -- the bucket -----------------------------------------------------------------------------

    async def _objects(self, store: ObjectStore) -> Sequence[ObjectInfo]:
        try:
            async with asyncio.timeout(LIST_TIMEOUT_S):
                return await store.list(ignore_deletes=True)
        except NotFoundError:
            return []  # what nats-py raises for a bucket with no (undeleted) object

    async def _clips(self, store: ObjectStore) -> Sidecars:
        clips = [body for body in map(_sidecar, await self._objects(store)) if body is not None]
        return sorted(clips, key=lambda c: c["created_at"])

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

    # -- the cache ------------------------------------------------------------------------------

    def _index(self) -> OrderedDict[str, int]:
        """What the cache holds, read from the directory on first use (oldest served first)."""
        if self._cache is None:
            entries: list[tuple[float, str, int]] = []
            if self.cache_dir.is_dir():
                for path in self.cache_dir.iterdir():
                    if path.name.startswith(".") and path.name.endswith(".part"):
                        path.unlink(missing_ok=True)  # a download cut short
                    elif path.is_file() and _split(path.name)[0] is not None:
                        stat = path.stat()
                        entries.append((stat.st_mtime, path.name, stat.st_size))
            self._cache = OrderedDict((name, size) for _, name, size in sorted(entries))
            self._cache_bytes = sum(self._cache.values())
        return self._cache

    def _cached(self, name: str) -> int | None:
        index = self._index()
        size = index.get(name)
        if size is not None and not (self.cache_dir / name).is_file():
            self._forget_cached(name)  # removed behind our back
            return None
        return size

    def _touch(self, name: str) -> None:
        self._index().move_to_end(name)
        with contextlib.suppress(OSError):
            os.utime(self.cache_dir / name)  # so the order survives a restart

    def _admit(self, name: str, size: int) -> None:
        index = self._index()
        self._forget_cached(name)
        index[name] = size
        self._cache_bytes += size
        while self._cache_bytes > self.cache_max_bytes and len(index) > 1:  # never the file just fetched
            oldest = next(iter(index))
            self._forget_cached(oldest)
            (self.cache_dir / oldest).unlink(missing_ok=True)
            self.stats.cache_evicted += 1

    def _forget_cached(self, name: str) -> None:
        size = self._index().pop(name, None)
        if size is not None:
            self._cache_bytes -= size

    def _drop_cached(self, clip_id: str) -> None:
        for suffix in SUFFIXES:
            self._forget_cached(clip_id + suffix)
            try:
                (self.cache_dir / (clip_id + suffix)).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cached clip file not removed", extra={"clip_id": clip_id, "error": str(exc)})

    # -- metrics --------------------------------------------------------------------------------

    def samples(self) -> Iterable[Sample]:
        """The counters for /metrics."""
        s = self.stats
        yield Sample("vidsentry_clip_bucket_uploads", "Clips uploaded to the fleet's clip bucket", s.uploaded)
        yield Sample("vidsentry_clip_bucket_upload_failures", "Clips not uploaded (outage, bucket full, file gone)",
                     s.upload_failed)
        yield Sample("vidsentry_clip_bucket_fetches", "Clip files copied from the bucket into the cache", s.fetched)
        yield Sample("vidsentry_clip_bucket_fetch_failures", "Clip files that could not be read from the bucket",
                     s.fetch_failed)
        yield Sample("vidsentry_clip_bucket_cache_hits", "Clip files served from the cache", s.cache_hits)
        for why, value in (("bytes", s.evicted_bytes), ("age", s.evicted_age)):
            yield Sample("vidsentry_clip_bucket_evicted", "Clips deleted from the bucket by retention", value,
                         labels=(("reason", why),))
        yield Sample("vidsentry_clip_bucket_cache_evicted", "Cached clip files removed for the cache's bound",
                     s.cache_evicted)
        yield Sample("vidsentry_clip_bucket_orphans_removed", "Leftovers of unfinished uploads removed",
                     s.orphans_removed)
        yield Sample("vidsentry_clip_bucket_maintenance_failures", "Retention or sweep runs cut short by an outage",
                     s.maintenance_failed)


def _open_upload(path: Path) -> io.BufferedReader:
    return path.open("rb")


def _split(name: str) -> tuple[str | None, str]:
    """(clip id, suffix) of an object or cached file name; (None, "") for anything else."""
    clip_id, suffix = name[:32], name[32:]
    if CLIP_ID.fullmatch(clip_id) and suffix in SUFFIXES:
        return clip_id, suffix
    return None, ""


def _sidecar(info: ObjectInfo) -> dict[str, Any] | None:
    """The sidecar a listed clip's MP4 object carries; None for anything else or a malformed one."""
    clip_id, suffix = _split(info.name)
    if clip_id is None or suffix != MP4 or info.deleted or not info.description:
        return None
    try:
        body = json.loads(info.description)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("clip_id") != clip_id:
        return None
    return body if _is_time(body.get("created_at")) else None


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _age(info: ObjectInfo, now: float) -> float:
    """Seconds since the object was put (its writer's clock); 0 when its mtime cannot be read."""
    try:
        return now - datetime.fromisoformat(info.mtime or "").timestamp()
    except ValueError:
        return 0.0


def _stored_estimate(size: int, meta_bytes: int) -> int:
    """What one object of `size` bytes takes in the stream, its chunks' and meta's framing included."""
    chunks = max(1, math.ceil(size / OBJ_DEFAULT_CHUNK_SIZE))
    return size + chunks * _CHUNK_OVERHEAD + _META_OVERHEAD + meta_bytes


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = [
    "SUFFIXES", "ClipBucket", "ClipBucketError", "ClipBucketStats", "clip_bucket_name", "object_name",
]
