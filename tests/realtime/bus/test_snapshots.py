"""NatsSnapshotStore on a real nats-server: bounded bucket, references that read back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NatsClient

from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from realtime.bus.snapshots import NatsSnapshotStore, SnapshotBucketFull, SnapshotStoreError, parse_reference

JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 40 + b"\xff\xd9"


@pytest.fixture
async def nc(shared_nats_server: EmbeddedNatsServer) -> AsyncIterator[NatsClient]:
    client = await nats.connect(shared_nats_server.url)
    yield client
    await client.close()


async def test_put_returns_a_reference_that_reads_back(nc: NatsClient) -> None:
    store = NatsSnapshotStore(nc, bucket="snaps-roundtrip", max_bytes=1_000_000, ttl_s=3600)
    reference = await store.put("cam/abc.jpg", JPEG)
    assert reference == "nats-object://snaps-roundtrip/cam/abc.jpg"
    assert parse_reference(reference) == ("snaps-roundtrip", "cam/abc.jpg")
    assert await store.get(reference) == JPEG
    # Any client reads it with nats-py's own object store API.
    obj = await (await nc.jetstream().object_store("snaps-roundtrip")).get("cam/abc.jpg")
    assert obj.data == JPEG and obj.info.headers == {"Content-Type": "image/jpeg"}


async def test_bucket_is_bounded_and_an_existing_one_takes_the_configured_limits(nc: NatsClient) -> None:
    await NatsSnapshotStore(nc, bucket="snaps-limits", max_bytes=50_000, ttl_s=600).put("a.jpg", JPEG)
    info = await nc.jetstream().stream_info("OBJ_snaps-limits")
    assert info.config.max_bytes == 50_000 and info.config.max_age == 600
    await NatsSnapshotStore(nc, bucket="snaps-limits", max_bytes=80_000, ttl_s=1200).put("b.jpg", JPEG)
    info = await nc.jetstream().stream_info("OBJ_snaps-limits")
    assert info.config.max_bytes == 80_000 and info.config.max_age == 1200


async def test_a_full_bucket_refuses_new_snapshots(nc: NatsClient) -> None:
    store = NatsSnapshotStore(nc, bucket="snaps-full", max_bytes=3 * len(JPEG), ttl_s=600)
    await store.put("1.jpg", JPEG)
    with pytest.raises(SnapshotBucketFull, match="snaps-full is full"):
        for i in range(2, 6):
            await store.put(f"{i}.jpg", JPEG)
    assert await store.get("1.jpg") == JPEG  # what was stored stays whole


async def test_shares_the_publishers_connection(shared_nats_server: EmbeddedNatsServer) -> None:
    publisher = NatsEventPublisher(shared_nats_server.url, node="test")
    store = NatsSnapshotStore(publisher, bucket="snaps-publisher")
    with pytest.raises(SnapshotStoreError, match="not connected"):
        await store.put("early.jpg", JPEG)  # before connect: a clean, countable failure
    async with publisher:
        reference = await store.put("cam/x.jpg", JPEG)
        assert await store.get(reference) == JPEG
    with pytest.raises(SnapshotStoreError):
        await store.put("late.jpg", JPEG)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="bucket name"):
        NatsSnapshotStore(NatsClient(), bucket="no.dots")
    with pytest.raises(ValueError):
        parse_reference("https://example/x.jpg")
