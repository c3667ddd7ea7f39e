"""NatsEventPublisher against a real nats-server with JetStream."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest
from nats.js.api import StorageType, StreamConfig

from pipelines.events import DURABLE_KINDS, EventKind, EventSink
from pipelines.frames import InvalidStreamId
from realtime.bus.cloudevents import parse_rfc3339
from realtime.bus.connection import BusUnavailable
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import DURABLE_SUBJECTS, STREAM_NAME
from realtime.bus.publisher import NatsEventPublisher
from tests.support.delivery import RecordingHooks
from tests.support.waiting import wait_until

from .util import event, inspector

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def publisher(nats_server: EmbeddedNatsServer) -> AsyncIterator[NatsEventPublisher]:
    pub = NatsEventPublisher(nats_server.url, node="test-node")
    await pub.connect()
    try:
        yield pub
    finally:
        await pub.close()


def test_publisher_is_an_event_sink() -> None:
    sink: EventSink = NatsEventPublisher("nats://127.0.0.1:1")
    assert callable(sink.publish)


async def test_headers_and_body_on_the_wire_for_every_kind(
    nats_server: EmbeddedNatsServer, publisher: NatsEventPublisher
) -> None:
    async with inspector(nats_server.url) as insp:
        sent = [event(kind, label=kind.value) for kind in EventKind]
        for ev in sent:
            await publisher.publish(ev)
        assert await publisher.flush(10)
        await wait_until(
            lambda: len(insp.live) >= len(sent),
            what=lambda: f"all kinds: got {[m.subject for m in insp.live]}, stats {publisher.stats}",
        )

    by_id = {msg.headers["ce-id"]: msg for msg in insp.live if msg.headers}
    assert set(by_id) == {ev.id for ev in sent}  # ce-id unique, one message per event
    for ev in sent:
        msg = by_id[ev.id]
        headers = msg.headers or {}
        assert msg.subject == f"vidsentry.cam1.{ev.kind.value}"
        assert headers["ce-specversion"] == "1.0"
        assert headers["ce-source"] == "/vidsentry/test-node/cam1"
        assert headers["ce-type"] == f"io.vidsentry.{ev.kind.value}.v1"
        assert parse_rfc3339(headers["ce-time"]).tzinfo is not None
        assert headers["ce-time"].endswith("Z")
        assert headers["content-type"] == "application/json"
        assert headers["Nats-Msg-Id"] == headers["ce-id"]
        body = json.loads(msg.data)
        assert body["stream_id"] == "cam1"
        assert body["label"] == ev.kind.value
        assert body["pts"] == ev.pts
        for name in ("captured_at", "published_at"):
            assert body[name].endswith("Z")
            parse_rfc3339(body[name])
        assert parse_rfc3339(body["published_at"]) >= parse_rfc3339(body["captured_at"])


async def test_live_kinds_use_core_nats_and_durable_kinds_land_in_jetstream(
    nats_server: EmbeddedNatsServer, publisher: NatsEventPublisher
) -> None:
    async with inspector(nats_server.url) as insp:
        detections = [event(EventKind.DETECTIONS) for _ in range(5)]
        partials = [event(EventKind.PARTIALS, text="hel") for _ in range(2)]
        tracks = [event(EventKind.TRACKS, track_id=i, phase="new") for i in range(3)]
        status = [event(EventKind.STATUS, state="live")]
        for ev in [*detections, *tracks, *partials, *status]:
            await publisher.publish(ev)
        assert await publisher.flush(10)
        await wait_until(lambda: len(insp.live) == 11, what="live delivery of all 11")

        assert await insp.stored_count() == len(tracks) + len(status)
        stored = await insp.stored()
        assert {m.subject for m in stored} == {"vidsentry.cam1.tracks", "vidsentry.cam1.status"}
        assert [m.headers["ce-id"] for m in stored if m.headers] == [e.id for e in [*tracks, *status]]

    stats = publisher.stats
    assert stats.kind("tracks").acked == 3
    assert stats.kind("status").acked == 1
    assert stats.kind("detections").published == 5
    assert stats.kind("detections").acked == 0
    assert stats.pending_acks == 0


async def test_same_event_id_is_deduplicated_by_jetstream(
    nats_server: EmbeddedNatsServer, publisher: NatsEventPublisher
) -> None:
    alert = event(EventKind.ALERTS, rule="fall", phase="start")
    await publisher.publish(alert)
    await publisher.publish(alert)  # e.g. a retry after a lost ack
    assert await publisher.flush(10)
    stats = publisher.stats.kind("alerts")
    assert (stats.published, stats.acked, stats.duplicates, stats.failed) == (2, 2, 1, 0)
    async with inspector(nats_server.url) as insp:
        assert await insp.stored_count() == 1


async def test_stream_created_when_missing_then_reused(nats_server: EmbeddedNatsServer) -> None:
    first = NatsEventPublisher(nats_server.url, stream_max_age_s=3600)
    await first.connect()  # creates it
    try:
        await first.publish(event(EventKind.CAPTIONS, text="hello"))
        assert await first.flush(10)
        async with inspector(nats_server.url) as insp:
            info = await insp.js.stream_info(STREAM_NAME)
            assert info.config.storage == StorageType.FILE
            assert info.config.max_age == 3600
            assert (info.config.duplicate_window or 0) >= 120
            assert sorted(info.config.subjects or []) == sorted(DURABLE_SUBJECTS)
        assert await first.ensure_stream() == "unchanged"
    finally:
        await first.close()

    second = NatsEventPublisher(nats_server.url, stream_max_age_s=3600)
    await second.connect()
    try:
        assert await second.ensure_stream() == "unchanged"
        async with inspector(nats_server.url) as insp:
            assert await insp.stored_count() == 1  # reused, not recreated
    finally:
        await second.close()


async def test_existing_stream_is_brought_up_to_our_settings(nats_server: EmbeddedNatsServer) -> None:
    async with inspector(nats_server.url) as insp:
        await insp.js.add_stream(
            StreamConfig(
                name=STREAM_NAME,
                subjects=["vidsentry.*.tracks", "vidsentry.*.custom"],
                storage=StorageType.FILE,
                duplicate_window=30,
                max_age=600,
            )
        )
        pub = NatsEventPublisher(nats_server.url, stream_max_age_s=7200)
        await pub.connect()
        try:
            assert await pub.ensure_stream() == "unchanged"  # connect() already reconciled it
            info = await insp.js.stream_info(STREAM_NAME)
            assert set(info.config.subjects or []) == {*DURABLE_SUBJECTS, "vidsentry.*.custom"}
            assert info.config.max_age == 7200
            assert info.config.duplicate_window == 120
        finally:
            await pub.close()


async def test_invalid_stream_id_is_rejected_with_a_clear_error(publisher: NatsEventPublisher) -> None:
    with pytest.raises(InvalidStreamId, match="invalid stream id 'bad.id'"):
        await publisher.publish(event(EventKind.TRACKS, stream_id="bad.id"))
    with pytest.raises(InvalidStreamId):
        await publisher.publish(event(EventKind.DETECTIONS, stream_id="has space"))
    assert publisher.stats.kinds == {}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_connect_to_closed_port_fails_within_the_bound_and_redacts_credentials() -> None:
    url = f"nats://alice:s3cret@127.0.0.1:{_closed_port()}"
    pub = NatsEventPublisher(url, connect_timeout=0.5)
    async with asyncio.timeout(10):  # guard against a hang; not a timing assertion
        with pytest.raises(BusUnavailable) as info:
            await pub.connect()
    message = str(info.value)
    assert "s3cret" not in message and "alice" not in message
    assert f"nats://***@127.0.0.1:{url.rsplit(':', 1)[1]}" in message
    assert "\n" not in message


async def test_connect_to_a_silent_port_fails_within_the_bound() -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accepts TCP, never speaks NATS
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        pub = NatsEventPublisher(f"nats://127.0.0.1:{port}", connect_timeout=0.5)
        async with asyncio.timeout(10):
            with pytest.raises(BusUnavailable, match="unusable"):
                await pub.connect()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_jetstream_that_does_not_answer_at_first_is_asked_again_until_the_bound(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster that has just started, or is electing its leader, may let the first stream set-up
    time out: the publisher asks again (the real server answers the third time here), and gives
    up with a clear error once STREAM_SETUP_WAIT_S has passed."""
    import nats.errors

    from realtime.bus import publisher as module

    real = module.ensure_stream
    calls: list[int] = []

    async def silent_twice(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) <= 2:
            raise nats.errors.TimeoutError
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "ensure_stream", silent_twice)
    pub = NatsEventPublisher(nats_server.url)
    await pub.connect()
    try:
        assert len(calls) == 3 and pub.connected
    finally:
        await pub.close()

    async def always_silent(*args: object, **kwargs: object) -> object:
        raise nats.errors.TimeoutError

    monkeypatch.setattr(module, "ensure_stream", always_silent)
    monkeypatch.setattr(module, "STREAM_SETUP_WAIT_S", 1.5)
    pub = NatsEventPublisher(nats_server.url)
    async with asyncio.timeout(10):
        with pytest.raises(BusUnavailable, match="did not answer"):
            await pub.connect()
    assert pub.nc is None


async def test_outstanding_acks_are_bounded(nats_server: EmbeddedNatsServer) -> None:
    pub = NatsEventPublisher(nats_server.url, max_pending_acks=4)
    await pub.connect()
    try:
        peak = 0
        for i in range(60):
            await pub.publish(event(EventKind.TRACKS, track_id=i))
            peak = max(peak, pub.stats.pending_acks)
        assert peak <= 4
        assert await pub.flush(10)
        assert pub.stats.kind("tracks").acked == 60
    finally:
        await pub.close()


async def test_hooks_see_acks_and_undeliverable_messages(nats_server: EmbeddedNatsServer) -> None:
    hooks = RecordingHooks()
    pub = NatsEventPublisher(nats_server.url, hooks=hooks)
    await pub.connect()
    ev = event(EventKind.DESCRIPTIONS, text="two people walking")
    await pub.publish(ev)
    await pub.publish(ev)
    await pub.close()
    await pub.publish(event(EventKind.STATUS, state="stopped"))  # after close: counted, handed over
    assert hooks.acked == [(ev.id, False), (ev.id, True)]
    assert hooks.errors == ["PublisherClosedError"]
    assert pub.stats.kind("status").failed == 1


async def test_close_drains_everything_published(nats_server: EmbeddedNatsServer) -> None:
    async with inspector(nats_server.url) as insp:
        pub = NatsEventPublisher(nats_server.url)
        await pub.connect()
        durable = [event(kind) for kind in sorted(DURABLE_KINDS) for _ in range(20)]
        live = [event(EventKind.DETECTIONS) for _ in range(20)]
        for ev in [*durable, *live]:
            await pub.publish(ev)
        await pub.close()  # no explicit flush
        stats = pub.stats
        assert stats.pending_acks == 0
        assert stats.totals().acked == len(durable)
        assert stats.totals().failed == 0
        assert not pub.connected
        assert await insp.stored_count() == len(durable)
        await wait_until(lambda: len(insp.live) == len(durable) + len(live), what="live delivery")


async def test_transport_failures_are_counted_not_raised(nats_server: EmbeddedNatsServer) -> None:
    hooks = RecordingHooks()
    pub = NatsEventPublisher(nats_server.url, hooks=hooks)
    await pub.connect()
    try:
        too_big = "x" * (2 * 1024 * 1024)  # over the server's 1 MiB max_payload
        await pub.publish(event(EventKind.DESCRIPTIONS, text=too_big))
        await pub.publish(event(EventKind.DETECTIONS, blob=too_big))
        await pub.publish(event(EventKind.DESCRIPTIONS, text="fine"))
        assert await pub.flush(10)
        stats = pub.stats
        assert stats.kind("descriptions").failed == 1
        assert stats.kind("descriptions").acked == 1
        assert stats.kind("detections").failed == 1
        assert hooks.errors == ["MaxPayloadError"]
        assert stats.last_error is not None and "MaxPayloadError" in stats.last_error
    finally:
        await pub.close()
