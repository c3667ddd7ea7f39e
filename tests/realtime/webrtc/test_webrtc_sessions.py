"""Browser sessions against the real service, with a real aiortc peer standing in for the page:
media through the shared detector, events back over the DataChannel and out on NATS, and
teardown that leaves no peer connection, task or thread behind."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import numpy as np
import pytest
from aiortc import RTCPeerConnection

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.peer import connect, load_frames, load_speech
from tests.support.service import LiveService, live_service, make_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def frames(vtest_avi: Path) -> list[np.ndarray]:
    return load_frames(vtest_avi, count=30)


@pytest.fixture(scope="module")
def speech(sample_dir: Path) -> np.ndarray:
    return load_speech(sample_dir / "narration.wav", seconds=6.0)


@pytest.fixture
async def svc(detector: Detector, shared_nats_server: EmbeddedNatsServer) -> AsyncIterator[LiveService]:
    # Every peer here is one client (127.0.0.1), and the cap test opens two before either connects.
    config = make_config(webrtc={"inactivity_timeout_s": 1.5, "max_sessions": 2, "max_connecting_per_client": 2})
    async with live_service(detector, shared_nats_server.url, config=config) as live:
        yield live


def peer_connections() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, RTCPeerConnection))


def decoder_threads() -> int:
    # aiortc decodes each received track in a thread of its own ("video-decoder", "audio-decoder").
    return sum(1 for t in threading.enumerate() if t.name.endswith("-decoder"))


def session_tasks(stream_id: str) -> list[str]:
    return [t.get_name() for t in asyncio.all_tasks() if stream_id in t.get_name() and not t.done()]


async def assert_nothing_left(svc: LiveService, stream_id: str, pcs_before: int) -> None:
    """The session's stream is gone, and so are its peer connection, tasks and decoder threads."""
    await wait_until(lambda: stream_id not in svc.service.registry and svc.service.registry.runner(stream_id) is None,
                     10, "the stream to leave the registry")
    await wait_until(lambda: svc.service.registry.running_count == 0, 10, "the run to end")
    await wait_until(lambda: decoder_threads() == 0, 10, "decoder threads to end")
    await wait_until(lambda: not session_tasks(stream_id), 10, f"tasks of {stream_id} to end")
    assert svc.service.sessions.count == 0
    assert peer_connections() <= pcs_before
    reply = await svc.call("GET", f"/api/streams/{stream_id}")
    assert reply.status == 404


async def test_detections_arrive_on_the_channel_and_on_nats(
    svc: LiveService, frames: list[np.ndarray], speech: np.ndarray, shared_nats_server: EmbeddedNatsServer
) -> None:
    nc = await nats.connect(shared_nats_server.url)
    received: list[dict[str, object]] = []

    async def on_message(msg: nats.aio.msg.Msg) -> None:
        received.append({"subject": msg.subject, "body": json.loads(msg.data)})

    await nc.subscribe("vidsentry.*.detections", cb=on_message)
    peer = await connect(svc.session, svc.url, frames=frames, speech=speech)
    try:
        stream_id = peer.stream_id
        assert stream_id.startswith("webrtc-") and peer.answer["close_token"]
        await peer.wait_for(lambda: any(m["body"]["objects"] for m in peer.of_kind("detections")), 20, "boxes")
        detections = peer.of_kind("detections")
        body = detections[-1]["body"]
        assert body["stream_id"] == stream_id and (body["width"], body["height"]) == (640, 480)
        assert all(m["lag_ms"] >= 0 for m in detections)
        assert any(m["kind"] == "status" and m["body"]["state"] == "live" for m in peer.messages)
        await wait_until(lambda: any(r["subject"] == f"vidsentry.{stream_id}.detections" for r in received), 10, "NATS")
        view = await svc.stream(stream_id)
        assert view["kind"] == "webrtc" and view["state"] == "live" and "url" not in view
        assert view["counters"]["frames_in"] > 0 and view["counters"]["webrtc_audio_frames"] > 0
        assert view["counters"]["channel_sent"] > 0
        listed = await svc.call("GET", "/api/streams")
        assert [s["id"] for s in listed.body["streams"]] == [stream_id]
        metrics = (await svc.call("GET", "/metrics")).body
        assert "vidsentry_webrtc_sessions 1.0" in metrics and "vidsentry_webrtc_sessions_opened_total 1.0" in metrics
        assert f'vidsentry_stream_channel_sent_total{{stream="{stream_id}"}}' in metrics
    finally:
        await peer.close()
        await nc.close()


@pytest.mark.parametrize("how", ["peer closes", "delete", "beacon", "media stops"])
async def test_every_way_a_session_ends_leaves_nothing_behind(
    svc: LiveService, frames: list[np.ndarray], speech: np.ndarray, how: str
) -> None:
    pcs_before = peer_connections()
    peer = await connect(svc.session, svc.url, frames=frames, speech=speech)
    stream_id = peer.stream_id
    await svc.wait_for_state(stream_id, "live", min_processed=1)
    assert decoder_threads() == 2
    if how == "peer closes":
        await peer.close()
        reason = "the page closed its data channel"  # SCTP goes down before ICE notices
    elif how == "delete":
        reply = await svc.call("DELETE", f"/api/streams/{stream_id}")
        assert reply.status == 204
        reason = "stopped"
        await wait_until(lambda: peer.pc.connectionState in ("closed", "failed"), 10, "the peer to see the end")
    elif how == "beacon":
        wrong = await svc.call(
            "POST", "/api/webrtc/close", data=json.dumps({"stream_id": stream_id, "close_token": "guess"}),
            content_type="text/plain",
        )
        assert wrong.status == 403 and stream_id in svc.service.sessions
        right = await svc.call(
            "POST", "/api/webrtc/close",
            data=json.dumps({"stream_id": stream_id, "close_token": peer.answer["close_token"]}),
            content_type="text/plain;charset=UTF-8",  # what sendBeacon sends for a string
        )
        assert right.status == 204, right
        reason = "the page went away"
    else:
        for sender in peer.pc.getSenders():
            if sender.track is not None:
                sender.track.stop()  # the connection stays up; no more media, like a frozen tab
        reason = "no media for 1.5 s"
    await wait_until(lambda: stream_id not in svc.service.sessions, 15, f"the session to end: {reason}")
    assert any(reason in r for r in svc.service.sessions.ended), svc.service.sessions.ended
    await peer.close()
    await assert_nothing_left(svc, stream_id, pcs_before + 1)  # + the test's own peer, still referenced


async def test_shutdown_ends_live_sessions(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, frames: list[np.ndarray]
) -> None:
    pcs_before = peer_connections()
    async with live_service(detector, shared_nats_server.url) as live:
        peer = await connect(live.session, live.url, frames=frames)
        await live.wait_for_state(peer.stream_id, "live", min_processed=1)
        service = live.service
    # live_service's exit stopped the service: the session ended with it.
    assert service.sessions.count == 0 and service.registry.running_count == 0
    await wait_until(lambda: peer.pc.connectionState in ("closed", "failed"), 10, "the peer to see the end")
    await peer.close()
    await wait_until(lambda: decoder_threads() == 0, 10, "decoder threads to end")
    assert peer_connections() <= pcs_before + 1  # the test's own peer


async def test_the_session_cap_answers_503_with_the_setting(svc: LiveService, frames: list[np.ndarray]) -> None:
    peers = [await connect(svc.session, svc.url, frames=frames) for _ in range(2)]
    try:
        with pytest.raises(AssertionError, match=r"503 .*session limit reached: 2 sessions \(webrtc.max_sessions\)"):
            await connect(svc.session, svc.url, frames=frames)
        assert svc.service.sessions.rejected == 1
    finally:
        for peer in peers:
            await peer.close()


async def test_a_chosen_stream_id_is_used_once(svc: LiveService, frames: list[np.ndarray]) -> None:
    peer = await connect(svc.session, svc.url, frames=frames, stream_id="kitchen")
    try:
        assert peer.stream_id == "kitchen"
        with pytest.raises(AssertionError, match="409"):
            await connect(svc.session, svc.url, frames=frames, stream_id="kitchen")
    finally:
        await peer.close()
