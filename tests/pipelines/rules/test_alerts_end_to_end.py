"""Rules through the real stream graph: vtest.avi → StreamRunner (real model, tracker, rules) →
NatsEventPublisher → JetStream, with the snapshot in the NATS object store."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import cv2
import numpy as np
from nats.aio.msg import Msg

from pipelines.detect import DetectionBatcher
from pipelines.frames import StreamState
from pipelines.graph import SharedEngines
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from realtime.bus.snapshots import NatsSnapshotStore
from realtime.streams.runner import StreamRunner
from tests.support.nats import stored_messages
from tests.support.streams import camera_spec

CONTRACT = {"alert_id", "rule_id", "rule_type", "event", "severity", "track_ids", "class", "evidence",
            "started_pts", "snapshot", "stream_id", "pts", "captured_at", "published_at"}  # fmt: skip


async def stored_alerts(url: str, stream_id: str) -> list[Msg]:
    return await stored_messages(url, f"vidsentry.{stream_id}.alerts")


async def test_alert_start_and_end_reach_jetstream_with_a_stored_snapshot(
    vtest_avi: Path, fall_batcher: DetectionBatcher, nats_server: EmbeddedNatsServer
) -> None:
    spec = camera_spec(
        "plaza",
        str(vtest_avi),
        audio=False,
        rules=[
            {"id": "people", "type": "present", "classes": ["Normal"], "for_s": 0.5, "snapshot": True,
             "severity": "info"},
        ],
    )  # fmt: skip
    async with NatsEventPublisher(nats_server.url, node="test") as publisher:
        snapshots = NatsSnapshotStore(publisher, max_bytes=10_000_000)
        runner = StreamRunner(spec, SharedEngines(fall_batcher, snapshots), publisher)
        task = asyncio.create_task(runner.run())
        deadline = time.monotonic() + 60
        # A start that wants a snapshot is published once the picture is stored.
        while runner.frame_loop is None or runner.frame_loop.stats.alerts.started < 1:
            assert time.monotonic() < deadline and not task.done(), "no alert"
            await asyncio.sleep(0.05)
        runner.stop()  # the stream stopping ends the open alert
        assert await asyncio.wait_for(task, 30) is StreamState.STOPPED
        assert await publisher.flush(10)
        stats = runner.frame_loop.stats.alerts
        messages = await stored_alerts(nats_server.url, "plaza")
        start, end = (json.loads(m.data) for m in messages)
        assert stats.started == stats.ended == 1 and stats.snapshots_stored == 1

        assert messages[0].headers["ce-type"] == "io.vidsentry.alerts.v1"
        assert set(start) == CONTRACT and set(end) == CONTRACT | {"ended_pts", "duration_s"}
        assert (start["event"], end["event"]) == ("start", "end") and start["alert_id"] == end["alert_id"]
        assert start["rule_id"] == "people" and start["rule_type"] == "present" and start["severity"] == "info"
        assert start["class"] == "Normal" and start["track_ids"] and start["evidence"]["count"] >= 1
        assert start["started_pts"] == start["pts"] and start["evidence"]["held_s"] >= 0.5
        assert end["evidence"]["reason"] == "stream_stopped" and end["duration_s"] >= 0
        reference = start["snapshot"]
        assert reference.startswith("nats-object://vidsentry-snapshots/plaza/") and end["snapshot"] == reference

        jpeg = await snapshots.get(reference)
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert jpeg[:2] == b"\xff\xd8" and image.shape == (576, 768, 3)


async def test_rules_that_do_not_fit_the_model_fail_the_stream_with_a_reason(
    vtest_avi: Path, fall_batcher: DetectionBatcher
) -> None:
    class Discard:
        async def publish(self, event: object) -> None:
            pass

    spec = camera_spec(
        "plaza", str(vtest_avi), audio=False, rules=[{"id": "cars", "type": "present", "classes": ["car"]}]
    )
    runner = StreamRunner(spec, SharedEngines(fall_batcher), Discard())
    assert await asyncio.wait_for(runner.run(), 30) is StreamState.FAILED
    assert "'car' not among the model's classes (Fall, Normal)" in (runner.reason or "")
