"""Opening a JetStream object store bucket whose limits the configuration owns.

Alert snapshots (realtime.bus.snapshots) and a fleet's clips (realtime.fleet.clip_bucket) each keep
a bucket bounded by bytes and age. Several workers may open it at once: the first creates it, the
others open what it created; an existing bucket takes the caller's limits, since the configuration
is the source of truth (lowering max_bytes keeps what is stored; JetStream refuses new objects
until there is room).
"""

from __future__ import annotations

from typing import Literal

from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import BadRequestError, BucketNotFoundError
from nats.js.object_store import OBJ_STREAM_TEMPLATE, ObjectStore

from realtime.errors import ServiceError

AGE_TOLERANCE_S = 1e-3  # JetStream keeps max_age in nanoseconds: a float read back may differ by that


class BucketLimitsRefused(ServiceError):
    """JetStream refused to set an existing bucket's limits; the message is its reason."""


async def open_object_bucket(
    js: JetStreamContext, bucket: str, *, description: str, max_bytes: int, max_age_s: float,
    storage: StorageType, replicas: int = 1,
) -> tuple[ObjectStore, Literal["created", "updated", "kept"]]:
    """The bucket, created with these limits when missing, or with its limits brought to these;
    and which of the three happened (for the caller's log). BucketLimitsRefused when JetStream
    will not take the limits of an existing bucket."""
    try:
        store = await js.object_store(bucket)
    except BucketNotFoundError:
        config = ObjectStoreConfig(description=description, ttl=max_age_s, max_bytes=max_bytes, storage=storage,
                                   replicas=replicas)
        try:
            return await js.create_object_store(bucket, config=config), "created"
        except BadRequestError:
            store = await js.object_store(bucket)  # another worker created it meanwhile
    current = (await js.stream_info(OBJ_STREAM_TEMPLATE.format(bucket=bucket))).config
    if current.max_bytes == max_bytes and abs((current.max_age or 0.0) - max_age_s) < AGE_TOLERANCE_S:
        return store, "kept"
    try:
        await js.update_stream(current.evolve(max_bytes=max_bytes, max_age=max_age_s))
    except BadRequestError as exc:
        raise BucketLimitsRefused(str(exc.description)) from None
    return store, "updated"
