"""WHEP (draft-ietf-wish-whep) at the HTTP level, with a real aiortc peer pulling a real RTSP
camera (the GStreamer server in tests/support): the camera's H.264 packets reach the viewer and
decode there with no encoder run in the service; the status codes and headers (201 with the
answer, Location, ETag, Link; DELETE; PATCH 405; OPTIONS); every bad request a 4xx with a
reason; `webrtc.max_viewers` refused with a 503 naming it, and DELETE freeing the slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.webrtc.live import LiveView
from tests.realtime.http.test_webrtc_offer import assert_refused
from tests.support.rtsp import RtspServer
from tests.support.service import LiveService, live_service, make_config
from tests.support.waiting import wait_until

TOKEN = "whep-token"
SDP = "application/sdp"


@pytest.fixture
async def svc(detector: Detector, shared_nats_server: EmbeddedNatsServer,
              rtsp_server: RtspServer) -> AsyncIterator[LiveService]:
    config = make_config(webrtc={"max_viewers": 2, "allow_local_candidates": True,
                                 "ice_servers": [{"urls": ["stun:stun.example:3478"]}]},
                         streams=[{"id": "cam", "url": rtsp_server.url("/test"), "audio": False}])
    async with live_service(detector, shared_nats_server.url, config=config, token=TOKEN) as live:
        await live.wait_for_state("cam", "live", within_s=20)
        yield live


async def recvonly_offer() -> RTCPeerConnection:
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc


async def post(svc: LiveService, path: str, sdp: str, token: str | None = TOKEN) -> tuple[int, Any, str]:
    headers = {"Content-Type": SDP, **({"Authorization": f"Bearer {token}"} if token else {})}
    async with svc.session.post(svc.url + path, data=sdp, headers=headers) as response:
        return response.status, response.headers, await response.text()


class Received:
    def __init__(self, pc: RTCPeerConnection) -> None:
        self.frames: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        pc.on("track", self._on_track)

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._tasks.append(asyncio.create_task(self._read(track)))

    async def _read(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                self.frames.append(await track.recv())
            except Exception:
                return

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def live_view(svc: LiveService) -> LiveView:
    live: LiveView = svc.service.live
    return live


async def test_a_viewer_pulls_the_camera_s_packets_as_they_came_and_delete_ends_it(svc: LiveService) -> None:
    pc = await recvonly_offer()
    received = Received(pc)
    try:
        status, headers, answer = await post(svc, "/whep/cam", pc.localDescription.sdp)
        assert status == 201, answer
        assert headers["Content-Type"] == SDP
        location = headers["Location"]
        assert location.startswith("/whep/cam/") and len(location) > len("/whep/cam/") + 16
        assert headers["ETag"].startswith('"') and headers["Cache-Control"] == "no-store"
        assert headers.getall("Link") == ['<stun:stun.example:3478>; rel="ice-server"']
        assert "H264/90000" in answer and "a=sendonly" in answer
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        # The camera's GOP is 15 frames: the viewer starts at the next keyframe, and decodes.
        await wait_until(lambda: len(received.frames) >= 20, 20, "20 decoded frames of the camera")
        frame = received.frames[-1]
        assert (frame.width, frame.height) == (320, 240)

        viewer = next(iter(live_view(svc)._viewers.values()))
        sender = next(t.sender for t in viewer.pc.getTransceivers() if t.sender.track is viewer.track)
        encoder = sender._RTCRtpSender__encoder  # type: ignore[attr-defined]
        assert encoder is not None and encoder.codec is None  # packed only: no libx264 context was opened
        assert live_view(svc).encoding.starts == 0  # nor the stream's live encoder: its packets are forwarded
        assert viewer.track.stats.packets >= 20

        clock = await svc.call("GET", location)
        assert clock.status == 200 and clock.body["rtp_clock_rate"] == 90000
        assert isinstance(clock.body["rtp_origin"], int)
        metrics = await svc.call("GET", "/metrics")
        assert "vidsentry_live_viewers 1.0" in metrics.body

        assert_refused(await svc.call("DELETE", "/whep/cam/not-the-resource"), 404, "no WHEP viewer")
        assert_refused(await svc.call("DELETE", location, token=None), 401, "Bearer")
        assert_refused(await svc.call("PATCH", location, data="a=end-of-candidates\r\n",
                                      content_type="application/trickle-ice-sdpfrag"), 405, "trickle")
        reply = await svc.call("DELETE", location)
        assert reply.status == 200, reply
        assert live_view(svc).count == 0 and live_view(svc).ended["deleted"] == 1
        assert_refused(await svc.call("DELETE", location), 404, "no WHEP viewer")
    finally:
        await received.aclose()
        await pc.close()


async def test_viewers_past_max_viewers_are_refused_naming_it_and_delete_frees_a_slot(svc: LiveService) -> None:
    peers = [await recvonly_offer() for _ in range(3)]
    try:
        locations = []
        for pc in peers[:2]:
            status, headers, answer = await post(svc, "/whep/cam", pc.localDescription.sdp)
            assert status == 201, answer
            locations.append(headers["Location"])
        status, headers, body = await post(svc, "/whep/cam", peers[2].localDescription.sdp)
        assert status == 503 and "webrtc.max_viewers" in body and headers["Retry-After"]
        assert live_view(svc).refused == 1
        assert (await svc.call("DELETE", locations[0])).status == 200
        status, _, answer = await post(svc, "/whep/cam", peers[2].localDescription.sdp)
        assert status == 201, answer
    finally:
        for pc in peers:
            await pc.close()


async def test_bad_requests_get_a_4xx_with_a_reason(svc: LiveService) -> None:
    pc = await recvonly_offer()
    try:
        sdp = pc.localDescription.sdp
        assert (await post(svc, "/whep/nope", sdp))[0] == 404
        assert (await post(svc, "/whep/bad%20id", sdp))[0] == 400
        assert (await post(svc, "/whep/cam", sdp, token=None))[0] == 401
        assert (await post(svc, "/whep/cam", "hello"))[0] == 400
        assert (await post(svc, "/whep/cam", sdp[: len(sdp) // 2]))[0] == 400
        reply = await svc.call("POST", "/whep/cam", data=sdp)  # as JSON
        assert reply.status == 415 and reply.headers["Accept-Post"] == SDP
        reply = await svc.call("OPTIONS", "/whep/cam", token=None)
        assert reply.status == 204 and reply.headers["Allow"] == "OPTIONS, POST" and "Link" not in reply.headers
        assert "Vidsentry-Live-Video" not in reply.headers  # nothing about the stream without the token
        reply = await svc.call("OPTIONS", "/whep/cam")
        assert reply.headers["Vidsentry-Live-Video"] == "offered" and "Link" in reply.headers
        reply = await svc.call("OPTIONS", "/whep/nope")
        assert reply.headers["Vidsentry-Live-Video"] == "not offered; no such stream"
        assert (await svc.call("PUT", "/whep/cam", data=sdp, content_type=SDP)).status == 405
        sendonly = RTCPeerConnection()  # an offer that receives no video
        sendonly.addTransceiver("audio", direction="recvonly")
        await sendonly.setLocalDescription(await sendonly.createOffer())
        status, _, body = await post(svc, "/whep/cam", sendonly.localDescription.sdp)
        await sendonly.close()
        assert status == 400 and "no video" in body
        assert live_view(svc).count == 0
    finally:
        await pc.close()


async def test_a_viewer_whose_sender_stops_reading_is_dropped_and_counted_and_the_other_plays_on(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, rtsp_server: RtspServer
) -> None:
    # The default max_viewer_skips: a stall of the loop may overflow the healthy viewer's small queue
    # once, but only the stuck one falls behind again and again without catching up in between.
    config = make_config(webrtc={"max_viewers": 2, "allow_local_candidates": True, "viewer_queue_packets": 8},
                         streams=[{"id": "cam", "url": rtsp_server.url("/test"), "audio": False}])
    async with live_service(detector, shared_nats_server.url, config=config, token=TOKEN) as svc:
        await svc.wait_for_state("cam", "live", within_s=20)
        peers = [await recvonly_offer() for _ in range(2)]
        received = [Received(pc) for pc in peers]
        try:
            for pc in peers:
                status, _, answer = await post(svc, "/whep/cam", pc.localDescription.sdp)
                assert status == 201, answer
                await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            await wait_until(lambda: all(len(r.frames) >= 5 for r in received), 20, "both viewers decoding")
            live = live_view(svc)
            stuck, playing = list(live._viewers.values())
            # The service's sender to one viewer stops taking packets (as a starved one would): its
            # queue fills, it is dropped, and the other viewer never notices.
            stuck.track.recv = asyncio.Event().wait  # type: ignore[method-assign,assignment]
            await wait_until(lambda: live.ended["behind"] == 1, 20, "the stuck viewer dropped")
            assert live.count == 1 and playing.end_reason is None and stuck.end_reason == "behind"
            assert len(stuck.track._queue) == 0  # nothing kept for it
            assert stuck.track.stats.skips == 3  # behind webrtc.max_viewer_skips (default) times in a row
            before = [len(r.frames) for r in received]  # which peer is `playing` is not known here: either
            await wait_until(lambda: max(len(r.frames) - b for r, b in zip(received, before, strict=True)) >= 10, 10,
                             "the other viewer still decoding")
            metrics = await svc.call("GET", "/metrics")
            assert 'vidsentry_live_viewers_ended_total{reason="behind"} 1.0' in metrics.body
        finally:
            for r in received:
                await r.aclose()
            for pc in peers:
                await pc.close()
