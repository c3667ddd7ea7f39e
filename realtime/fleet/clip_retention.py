"""ClipRetention: which clips the fleet's clip bucket keeps, and how the others leave it.

Retention. The stream is capped at `max_bytes` with the discard-new policy nats-py gives object
stores: JetStream refuses a new chunk instead of dropping an old one, so a stored clip stays whole.
A `put` that finds the bucket full (err_code 10077) deletes the oldest clips to make room
(`make_room`) and tries once more. `enforce()` deletes clips older than `max_age_s`, and the oldest
while the bucket holds more than `max_bytes` (after the limit was lowered JetStream keeps what it
already holds). The stream's own max age, `BACKSTOP_GRACE_S` past `max_age_s`, only matters when no
worker runs `enforce()`: it expires a clip's chunks a moment before its meta, where `enforce()`
removes it whole.

Removal. A clip is removed by purging its metas, then its chunks: nats-py's delete() publishes a
"deleted" meta first, which a full bucket refuses after purging the chunks anyway (listed, nothing
to serve). A removed clip's cached copies go with it.

Unfinished uploads. An upload stopped before its meta message leaves chunks that no meta points at,
and maybe the clip's extras without its MP4; `sweep()` removes both once older than `orphan_age_s`
(an upload under way is younger).

Outages. `enforce()` and `sweep()` log, count the run in `maintenance_failed` and return.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.api import ObjectInfo
from nats.js.errors import ObjectNotFoundError
from nats.js.object_store import (
    OBJ_ALL_CHUNKS_PRE_TEMPLATE,
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_META_PRE_TEMPLATE,
    OBJ_STREAM_TEMPLATE,
    ObjectStore,
)

from realtime.fleet.clip_cache import ClipCache
from realtime.fleet.clip_objects import (
    MP4,
    OUTAGE,
    SUFFIXES,
    ClipBucketStats,
    Sidecars,
    list_clips,
    list_objects,
    reason,
    split_name,
)

log = logging.getLogger("realtime.fleet.clip_bucket")  # the clip bucket's log, under the name it always had

BACKSTOP_GRACE_S = 3600.0  # the stream's max age is this past max_age_s

Connect = Callable[[], Awaitable[tuple[JetStreamContext, ObjectStore]]]


class ClipRetention:
    """Retention and removal for one clip bucket (see the module docstring). `connect` gives the
    bucket's handles; removed clips leave `cache` too; counts in the bucket's `stats`."""

    def __init__(self, bucket: str, *, max_bytes: int, max_age_s: float, orphan_age_s: float, connect: Connect,
                 cache: ClipCache, stats: ClipBucketStats) -> None:
        self.bucket = bucket
        self.max_bytes = max_bytes
        self.max_age_s = float(max_age_s)
        self.orphan_age_s = float(orphan_age_s)
        self.stats = stats
        self._connect = connect
        self._cache = cache
        self._stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket)

    @property
    def stream_max_age_s(self) -> float:
        return self.max_age_s + BACKSTOP_GRACE_S

    async def enforce(self, now: float | None = None) -> int:
        """Delete clips past `max_age_s`, then the oldest while the bucket holds more than
        `max_bytes` (the newest stays). Returns how many were deleted; an outage is logged."""
        now = time.time() if now is None else now
        removed = 0
        try:
            js, store = await self._connect()
            kept: Sidecars = []
            for clip in await list_clips(store):
                if now - clip["created_at"] <= self.max_age_s:
                    kept.append(clip)
                elif await self.remove(js, store, clip["clip_id"]):
                    self.stats.evicted_age += 1
                    removed += 1
            used = (await store.status()).size
            while used > self.max_bytes and len(kept) > 1:
                oldest = kept.pop(0)
                if await self.remove(js, store, oldest["clip_id"]):
                    self.stats.evicted_bytes += 1
                    removed += 1
                used = (await store.status()).size
        except OUTAGE as exc:
            self.stats.maintenance_failed += 1
            log.warning("clip retention not applied", extra={"bucket": self.bucket, "error": reason(exc)})
        return removed

    async def make_room(self, needed: int, *, keep: str) -> bool:
        """Delete the oldest clips until `needed` more bytes fit under the stream's limit; False when
        they never can (a clip larger than the bucket, or a stream without a byte limit)."""
        js, store = await self._connect()
        status = await store.status()
        limit = status.stream_info.config.max_bytes or -1
        if limit < 0 or needed > limit:
            return False
        used = status.size
        for clip in await list_clips(store):
            if used + needed <= limit:
                break
            if clip["clip_id"] == keep:
                continue
            if await self.remove(js, store, clip["clip_id"]):
                self.stats.evicted_bytes += 1
                log.info("clip evicted to make room", extra={"clip_id": clip["clip_id"], "bucket": self.bucket})
            used = (await store.status()).size
        return True  # the retry says whether it fits (the sizes here are estimates)

    async def sweep(self, now: float | None = None) -> int:
        """Remove what unfinished uploads left, once older than `orphan_age_s`: extras of a clip whose
        MP4 never came, and chunks no object points at. Returns how many; an outage is logged."""
        now = time.time() if now is None else now
        removed = 0
        try:
            js, store = await self._connect()
            objects = await list_objects(store)
            clips = {o.name[:-len(MP4)] for o in objects if split_name(o.name)[1] == MP4}
            for obj in objects:
                clip_id, suffix = split_name(obj.name)
                if clip_id is None or suffix == MP4 or clip_id in clips or _age(obj, now) <= self.orphan_age_s:
                    continue
                if await self.remove_object(js, store, obj.name):
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
        except OUTAGE as exc:
            self.stats.maintenance_failed += 1
            log.warning("clip bucket sweep cut short", extra={"bucket": self.bucket, "error": reason(exc)})
        self.stats.orphans_removed += removed
        return removed

    async def remove(self, js: JetStreamContext, store: ObjectStore, clip_id: str) -> bool:
        """Delete a clip's objects, the MP4 first (the clip is unlisted from then on)."""
        found = False
        for suffix in SUFFIXES:
            found = await self.remove_object(js, store, clip_id + suffix) or found
        self._cache.drop(clip_id)
        return found

    async def remove_object(self, js: JetStreamContext, store: ObjectStore, name: str) -> bool:
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


def _age(info: ObjectInfo, now: float) -> float:
    """Seconds since the object was put (its writer's clock); 0 when its mtime cannot be read."""
    try:
        return now - datetime.fromisoformat(info.mtime or "").timestamp()
    except ValueError:
        return 0.0
