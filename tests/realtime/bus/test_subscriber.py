"""`subscribe()` prints events as JSON lines (the `vidsentry subscribe` command)."""

from __future__ import annotations

import asyncio
import io
import json
import socket

import pytest

from pipelines.events import EventKind
from realtime.bus.connection import BusUnavailable
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from realtime.bus.subscriber import subscribe

from .util import event

pytestmark = pytest.mark.timeout(60)


async def test_prints_one_json_object_per_line(nats_server: EmbeddedNatsServer) -> None:
    # A server of its own: a stream store or client left busy by earlier tests cannot delay delivery.
    out = io.StringIO()
    ready = asyncio.Event()
    pub = NatsEventPublisher(nats_server.url, node="sub-test")
    await pub.connect()
    try:
        task = asyncio.create_task(subscribe(nats_server.url, "vidsentry.subcam.>", out, limit=3, on_ready=ready.set))
        async with asyncio.timeout(20):
            await ready.wait()
        sent = [
            event(EventKind.DETECTIONS, stream_id="subcam", objects=[{"label": "person"}]),
            event(EventKind.TRACKS, stream_id="subcam", track_id=7, phase="new"),
            event(EventKind.CAPTIONS, stream_id="subcam", text="hello there"),
        ]
        for ev in sent:
            await pub.publish(ev)
        done, _ = await asyncio.wait({task}, timeout=20)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            pytest.fail(f"3 events published, printed only: {out.getvalue()!r}; publisher: {pub.stats}")
        printed = task.result()
    finally:
        await pub.close()

    assert printed == 3
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    assert {r["headers"]["ce-id"] for r in records} == {ev.id for ev in sent}
    for record in records:
        assert list(record) == ["subject", "headers", "data"]
        kind = record["subject"].rsplit(".", 1)[1]
        assert record["headers"]["ce-type"] == f"io.vidsentry.{kind}.v1"
        assert record["headers"]["ce-source"] == "/vidsentry/sub-test/subcam"
        assert record["data"]["stream_id"] == "subcam"
        assert "Nats-Msg-Id" not in record["headers"]


async def test_duration_ends_a_quiet_subscription(shared_nats_server: EmbeddedNatsServer) -> None:
    out = io.StringIO()
    async with asyncio.timeout(20):
        printed = await subscribe(shared_nats_server.url, "vidsentry.quiet.>", out, duration=0.2)
    assert printed == 0 and out.getvalue() == ""


async def test_unreachable_server_is_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with asyncio.timeout(20):
        with pytest.raises(BusUnavailable, match=f"127.0.0.1:{port} unreachable"):
            await subscribe(f"nats://127.0.0.1:{port}", out=io.StringIO(), connect_timeout=0.3)


async def test_bad_subject_is_a_value_error(shared_nats_server: EmbeddedNatsServer) -> None:
    with pytest.raises(ValueError, match="invalid NATS subject"):
        await subscribe(shared_nats_server.url, "vidsentry..>", out=io.StringIO(), limit=1)
