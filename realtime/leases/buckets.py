"""The fleet's two JetStream key-value buckets, created if missing.

The lease bucket's max age is the lease TTL: a lease or node record not renewed within it
expires, and the server writes a marker that every watcher sees. The first worker creates the
bucket; a worker configured with another TTL uses the bucket's own (leases must expire when
every worker expects them to), and says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from realtime.leases.records import desired_bucket, lease_bucket

log = logging.getLogger("realtime.fleet.buckets")  # the buckets' log, under the name it always had

_STREAM_IN_USE = 10058  # "stream name already in use with a different configuration"
MARKER_TTL_S = 1.0  # expiry markers live this long: watchers see them, nobody keeps them


@dataclass(frozen=True, slots=True)
class FleetBuckets:
    desired: KeyValue
    leases: KeyValue
    lease_ttl_s: float  # what the server enforces, which may differ from the setting


async def open_buckets(js: JetStreamContext, fleet: str, *, lease_ttl_s: float, replicas: int) -> FleetBuckets:
    desired = await _bucket(js, KeyValueConfig(
        bucket=desired_bucket(fleet), history=1, storage=StorageType.FILE, replicas=replicas,
        description=f"vidsentry fleet {fleet}: desired streams",
    ))
    leases = await _bucket(js, KeyValueConfig(
        bucket=lease_bucket(fleet), history=1, ttl=lease_ttl_s, storage=StorageType.FILE, replicas=replicas,
        limit_marker_ttl=MARKER_TTL_S, description=f"vidsentry fleet {fleet}: stream leases and workers",
    ))
    ttl = (await leases.status()).ttl or lease_ttl_s
    if abs(ttl - lease_ttl_s) > 1e-3:
        log.warning(
            "the fleet's lease bucket has another TTL; using it",
            extra={"bucket": lease_bucket(fleet), "bucket_ttl_s": ttl, "configured_ttl_s": lease_ttl_s},
        )
    return FleetBuckets(desired, leases, ttl)


def roles_bucket(fleet: str) -> str:
    """Bucket of the fleet-wide roles one worker at a time holds (the timeline's indexer)."""
    return f"vidsentry-fleet-{fleet}-roles"


async def open_roles(js: JetStreamContext, fleet: str, *, lease_ttl_s: float, replicas: int) -> KeyValue:
    """The roles bucket: leases like the streams', in a bucket of their own so they are never
    taken for a stream's."""
    return await _bucket(js, KeyValueConfig(
        bucket=roles_bucket(fleet), history=1, ttl=lease_ttl_s, storage=StorageType.FILE, replicas=replicas,
        description=f"vidsentry fleet {fleet}: roles one worker holds at a time"))


async def _bucket(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    try:
        return await js.create_key_value(config)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != _STREAM_IN_USE:
            raise
    assert config.bucket is not None
    return await js.key_value(config.bucket)  # made by another worker with other settings: use it as it is
