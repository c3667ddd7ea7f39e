"""Streams side by side on one detector and one publisher: isolation and status on the wire."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engines.registry import create_detector
from pipelines.detect import DetectionBatcher
from pipelines.events import Event, EventKind
from pipelines.frames import StreamState
from pipelines.graph import SharedEngines
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from realtime.sources.supervisor import SupervisorPolicy
from realtime.streams.runner import StreamRunner
from tests.support.nats import stored_messages
from tests.support.rtsp import RtspServer
from tests.support.streams import camera_spec
from tests.support.waiting import wait_until

FAST_POLICY = SupervisorPolicy(
    backoff_initial=0.2, backoff_max=1.0, watchdog_s=1.5, stall_restart_s=4.0, open_timeout_s=3.0
)
# For a camera whose states a test asserts: a 1.5 s watchdog reads a reader starved of CPU on a
# loaded machine as a stall, which these tests are not about.
STEADY_POLICY = dataclasses.replace(FAST_POLICY, watchdog_s=30.0)




@pytest.fixture
async def batcher(nudenet_model: Path) -> AsyncIterator[DetectionBatcher]:
    detector = create_detector(nudenet_model, "onnx-cpu", threads=1)
    async with DetectionBatcher(detector) as batcher:
        yield batcher
    detector.close()


@pytest.fixture
async def publisher(nats_server: EmbeddedNatsServer) -> AsyncIterator[NatsEventPublisher]:
    async with NatsEventPublisher(nats_server.url, node="test") as publisher:
        yield publisher


class BrokenSink:
    """A sink whose detections publishing fails, standing in for a bug in one stream's stage."""

    def __init__(self, inner: NatsEventPublisher) -> None:
        self.inner = inner

    async def publish(self, event: Event) -> None:
        if event.kind is EventKind.DETECTIONS:
            raise RuntimeError("simulated bug in a stage")
        await self.inner.publish(event)


async def test_bad_sources_never_take_down_a_good_one(
    rtsp_server: RtspServer, batcher: DetectionBatcher, publisher: NatsEventPublisher, tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"\x00not a video\x00" * 10_000)
    good = StreamRunner(
        camera_spec("good", rtsp_server.url("/test"), policy=STEADY_POLICY), SharedEngines(batcher), publisher
    )
    refused = StreamRunner(
        camera_spec("refused", "rtsp://127.0.0.1:1/cam", policy=FAST_POLICY), SharedEngines(batcher), publisher
    )
    corrupt = StreamRunner(camera_spec("corrupt", str(garbage), policy=FAST_POLICY), SharedEngines(batcher), publisher)
    buggy = StreamRunner(
        camera_spec("buggy", rtsp_server.url("/test"), policy=FAST_POLICY),
        SharedEngines(batcher),
        BrokenSink(publisher),
    )
    runners = [good, refused, corrupt, buggy]
    tasks = [asyncio.create_task(r.run()) for r in runners]
    await wait_until(lambda: corrupt.state is StreamState.FAILED, 10, "the corrupt file to fail")
    await wait_until(lambda: buggy.state is StreamState.FAILED, 15, "the buggy stream to fail")
    processed_then = good.summary().get("frames_processed")
    # The good camera keeps going while the others failed or keep retrying.
    await wait_until(lambda: good.summary().get("frames_processed") > processed_then + 5, 15, "more frames")
    await wait_until(lambda: refused.supervisor is not None and refused.supervisor.stats.connect_attempts >= 3, 15,
                     "three connects to the refused camera")
    assert good.state is StreamState.LIVE
    assert refused.state in {StreamState.CONNECTING, StreamState.RECONNECTING}
    for runner in runners:
        runner.stop()
    states = await asyncio.wait_for(asyncio.gather(*tasks), 15)
    assert states == [StreamState.STOPPED, StreamState.STOPPED, StreamState.FAILED, StreamState.FAILED]
    assert "simulated bug" in (buggy.reason or "")


async def stored_states(url: str, stream_id: str) -> list[str]:
    return [json.loads(msg.data)["state"] for msg in await stored_messages(url, f"vidsentry.{stream_id}.status")]


@pytest.mark.parametrize("ingest", ["pyav", "gstreamer"])
async def test_camera_restart_comes_back_live_and_status_events_arrive_in_order(
    ingest: str,
    rtsp_server: RtspServer,
    batcher: DetectionBatcher,
    publisher: NatsEventPublisher,
    nats_server: EmbeddedNatsServer,
) -> None:
    runner = StreamRunner(
        camera_spec("gate", rtsp_server.url("/test"), ingest=ingest, policy=STEADY_POLICY),
        SharedEngines(batcher),
        publisher,
    )
    task = asyncio.create_task(runner.run())
    await wait_until(lambda: runner.state is StreamState.LIVE, 15, "live")
    rtsp_server.kill()
    await wait_until(lambda: runner.state is not StreamState.LIVE, 40, "the outage to be noticed")
    rtsp_server.restart()
    await wait_until(lambda: runner.state is StreamState.LIVE, 20, "live again")
    before = runner.summary().get("frames_processed")
    await wait_until(lambda: runner.summary().get("frames_processed") > before + 3, 10, "frames after the restart")
    runner.stop()
    assert await asyncio.wait_for(task, 15) is StreamState.STOPPED
    await publisher.flush(timeout=10)

    states = await stored_states(nats_server.url, "gate")
    assert states[:2] == ["connecting", "live"] and states[-1] == "stopped"
    middle = states[2:-2]
    assert states[-2] == "live"
    # The outage: reconnecting first (or stalled, if the kill was seen as silence), then
    # reconnect attempts, each 'connecting' answered by 'reconnecting' until one succeeds.
    assert middle and middle[0] in {"reconnecting", "stalled"}, states
    assert set(middle) <= {"stalled", "reconnecting", "connecting"}, states
    assert middle[-1] == "connecting", states
    assert runner.summary().get("reconnects") >= 1
