"""What the fleet's clip bucket, its cache and its retention agree on (realtime.fleet.clip_bucket).

Names. A clip's objects, and its cached files, are named `<id><suffix>`: `object_name` builds
them only from a clip id and a known suffix, and `split_name` reads them back, so neither a name
nor a cache path is ever built from anything else.

Listing. A clip is listed exactly when its MP4 object is, and that object's description holds the
clip's sidecar: one listing of the bucket gives every clip's metadata, oldest first, without a GET
per clip. An object whose upload never reached its meta message is not in the listing at all.

Outages. What the bucket's callers treat as "cannot say now" rather than a bug: NATS errors,
timeouts and `ClipBucketError`; a fetch adds the local disk's `OSError`.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.js.api import ObjectInfo
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from pipelines.capability import Sample
from pipelines.clips.store import CLIP_ID, EXTRAS
from realtime.errors import ServiceError

MP4 = ".mp4"
SUFFIXES = (MP4, *EXTRAS)  # the objects of one clip, the MP4 first (deleting it unlists the clip at once)
LIST_TIMEOUT_S = 30.0  # one listing (a watch over every meta message)

Sidecars = list[dict[str, Any]]  # (ClipBucket's own `list` hides the builtin in its annotations)


class ClipBucketError(ServiceError):
    """The bucket cannot be read now (not connected, timed out, an error from JetStream), or its
    limits cannot be set. Raised by `list`, `get` and `delete`; `put` and `fetch` report the same
    as False / None."""


OUTAGE: tuple[type[BaseException], ...] = (nats.errors.Error, TimeoutError, ClipBucketError)
OUTAGE_OR_DISK: tuple[type[BaseException], ...] = (*OUTAGE, OSError)


@dataclass(slots=True)
class ClipBucketStats:
    """One set of counters for the bucket, its cache and its retention (each counts its own)."""

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

    def samples(self) -> Iterator[Sample]:
        """The counters for /metrics."""
        yield Sample("vidsentry_clip_bucket_uploads", "Clips uploaded to the fleet's clip bucket", self.uploaded)
        yield Sample("vidsentry_clip_bucket_upload_failures", "Clips not uploaded (outage, bucket full, file gone)",
                     self.upload_failed)
        yield Sample("vidsentry_clip_bucket_fetches", "Clip files copied from the bucket into the cache", self.fetched)
        yield Sample("vidsentry_clip_bucket_fetch_failures", "Clip files that could not be read from the bucket",
                     self.fetch_failed)
        yield Sample("vidsentry_clip_bucket_cache_hits", "Clip files served from the cache", self.cache_hits)
        for why, value in (("bytes", self.evicted_bytes), ("age", self.evicted_age)):
            yield Sample("vidsentry_clip_bucket_evicted", "Clips deleted from the bucket by retention", value,
                         labels=(("reason", why),))
        yield Sample("vidsentry_clip_bucket_cache_evicted", "Cached clip files removed for the cache's bound",
                     self.cache_evicted)
        yield Sample("vidsentry_clip_bucket_orphans_removed", "Leftovers of unfinished uploads removed",
                     self.orphans_removed)
        yield Sample("vidsentry_clip_bucket_maintenance_failures", "Retention or sweep runs cut short by an outage",
                     self.maintenance_failed)


def object_name(clip_id: str, suffix: str) -> str:
    """`<id><suffix>`, only for a clip id and a known suffix (ValueError otherwise): names and
    cache paths are never built from anything else."""
    if not isinstance(clip_id, str) or not CLIP_ID.fullmatch(clip_id):
        raise ValueError(f"not a clip id: {clip_id!r}")
    if suffix not in SUFFIXES:
        raise ValueError(f"not a clip file suffix: {suffix!r}")
    return clip_id + suffix


def split_name(name: str) -> tuple[str | None, str]:
    """(clip id, suffix) of an object or cached file name; (None, "") for anything else."""
    clip_id, suffix = name[:32], name[32:]
    if CLIP_ID.fullmatch(clip_id) and suffix in SUFFIXES:
        return clip_id, suffix
    return None, ""


def sidecar_of(info: ObjectInfo) -> dict[str, Any] | None:
    """The sidecar a listed clip's MP4 object carries; None for anything else or a malformed one."""
    clip_id, suffix = split_name(info.name)
    if clip_id is None or suffix != MP4 or info.deleted or not info.description:
        return None
    try:
        body = json.loads(info.description)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("clip_id") != clip_id:
        return None
    return body if is_time(body.get("created_at")) else None


def is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


async def list_objects(store: ObjectStore) -> Sequence[ObjectInfo]:
    try:
        async with asyncio.timeout(LIST_TIMEOUT_S):
            return await store.list(ignore_deletes=True)
    except NotFoundError:
        return []  # what nats-py raises for a bucket with no (undeleted) object


async def list_clips(store: ObjectStore) -> Sidecars:
    """Every listed clip's sidecar, oldest first."""
    clips = [body for body in map(sidecar_of, await list_objects(store)) if body is not None]
    return sorted(clips, key=lambda c: c["created_at"])


def reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
