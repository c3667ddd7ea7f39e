"""NatsSnapshotStore: alert snapshots (JPEG) in a JetStream object store bucket.

The bucket is bounded twice: `max_bytes` caps its size and `ttl_s` ages snapshots out. When it
is full, JetStream refuses new objects (the object store's discard policy, which keeps every
stored picture whole) until old ones expire; the alert then goes out with `snapshot: null` and
the miss is counted by the frame loop. Size the bucket for `ttl_s` x the expected alert rate.

An alert names its picture `nats-object://<bucket>/<key>`; `get()` reads one back, as does
`nats object get <bucket> <key>`.
"""

from __future__ import annotations

import asyncio
import logging
import re

from nats.aio.client import Client as NatsClient
from nats.js.api import ObjectMeta, StorageType
from nats.js.errors import APIError
from nats.js.object_store import ObjectStore

from realtime.bus.object_buckets import BucketLimitsRefused, open_object_bucket
from realtime.bus.publisher import NatsEventPublisher, live_client
from realtime.errors import ServiceError

log = logging.getLogger(__name__)

SCHEME = "nats-object://"
DEFAULT_BUCKET = "vidsentry-snapshots"
DEFAULT_MAX_BYTES = 1024**3  # 1 GiB: ~10,000 full-HD snapshots
DEFAULT_TTL_S = 7 * 24 * 3600.0  # as long as the VIDSENTRY stream keeps the alerts pointing at them
DEFAULT_GET_TIMEOUT_S = 10.0
_BUCKET_PATTERN = re.compile(r"[A-Za-z0-9_-]+")  # what JetStream accepts as a bucket name
_MAX_BYTES_EXCEEDED = 10077  # JetStream err_code


class SnapshotStoreError(ServiceError, RuntimeError):
    """The store cannot be used right now (not connected, bucket cannot be created)."""


class SnapshotBucketFull(SnapshotStoreError):
    """The bucket reached max_bytes."""


def snapshot_reference(bucket: str, key: str) -> str:
    return f"{SCHEME}{bucket}/{key}"


def parse_reference(reference: str) -> tuple[str, str]:
    """(bucket, key) of a `nats-object://bucket/key` reference; ValueError if it is not one."""
    if not reference.startswith(SCHEME):
        raise ValueError(f"not a snapshot reference: {reference!r}")
    bucket, _, key = reference[len(SCHEME) :].partition("/")
    if not _BUCKET_PATTERN.fullmatch(bucket) or not key:
        raise ValueError(f"not a snapshot reference: {reference!r}")
    return bucket, key


class NatsSnapshotStore:
    """Implements `pipelines.rules.snapshots.SnapshotStore`.

    Give it a connected nats-py client, or the service's `NatsEventPublisher` to share its
    connection (looked up on each call, so the publisher may connect after this is built, and
    nats-py's reconnects are ridden through). The bucket is created on first use, or its
    limits brought to `max_bytes` / `ttl_s` if it exists.
    """

    def __init__(
        self,
        nc_or_publisher: NatsClient | NatsEventPublisher,
        *,
        bucket: str = DEFAULT_BUCKET,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl_s: float = DEFAULT_TTL_S,
        storage: StorageType = StorageType.FILE,
    ) -> None:
        if not _BUCKET_PATTERN.fullmatch(bucket):
            raise ValueError(f"bucket name {bucket!r}: use A-Z a-z 0-9 _ -")
        if max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self._source = nc_or_publisher
        self.bucket = bucket
        self.max_bytes = max_bytes
        self.ttl_s = float(ttl_s)
        self.storage = storage
        self._store: tuple[NatsClient, ObjectStore] | None = None
        self._lock = asyncio.Lock()

    async def put(self, key: str, jpeg: bytes) -> str:
        store = await self._object_store()
        try:
            await store.put(key, jpeg, meta=ObjectMeta(name=key, headers={"Content-Type": "image/jpeg"}))
        except APIError as exc:
            if exc.err_code == _MAX_BYTES_EXCEEDED:
                raise SnapshotBucketFull(
                    f"snapshot bucket {self.bucket} is full ({self.max_bytes} bytes); "
                    "new snapshots are refused until old ones expire"
                ) from None
            raise
        return snapshot_reference(self.bucket, key)

    async def get(self, reference: str, timeout_s: float = DEFAULT_GET_TIMEOUT_S) -> bytes:
        """The bytes behind a reference (or a bare key) from this store's bucket."""
        key = reference
        if reference.startswith(SCHEME):
            bucket, key = parse_reference(reference)
            if bucket != self.bucket:
                raise ValueError(f"{reference!r} is not in bucket {self.bucket!r}")
        store = await self._object_store()
        # nats-py waits for the chunks without a limit; an object whose chunks are gone would hang.
        async with asyncio.timeout(timeout_s):
            result = await store.get(key)
        return bytes(result.data or b"")

    def _client(self) -> NatsClient:
        nc = live_client(self._source)
        if nc is None:
            raise SnapshotStoreError("NATS is not connected")
        return nc

    async def _object_store(self) -> ObjectStore:
        nc = self._client()
        cached = self._store
        if cached is not None and cached[0] is nc:
            return cached[1]
        async with self._lock:  # concurrent first puts create the bucket once
            if self._store is None or self._store[0] is not nc:
                self._store = (nc, await self._ensure_bucket(nc))
            return self._store[1]

    async def _ensure_bucket(self, nc: NatsClient) -> ObjectStore:
        try:
            store, done = await open_object_bucket(
                nc.jetstream(), self.bucket, description="vidsentry alert snapshots", max_bytes=self.max_bytes,
                max_age_s=self.ttl_s, storage=self.storage)
        except BucketLimitsRefused as exc:
            raise SnapshotStoreError(f"cannot set limits of snapshot bucket {self.bucket}: {exc}") from None
        if done != "kept":
            log.info("%s snapshot bucket %s max_bytes=%d ttl_s=%g", done, self.bucket, self.max_bytes, self.ttl_s)
        return store
