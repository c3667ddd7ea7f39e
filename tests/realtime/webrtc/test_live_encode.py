"""Live video for streams whose packets cannot be forwarded, with real parts: the sample MPEG-4
clip (vtest.avi: Microsoft MPEG-4 v3) read as a camera, a browser session (an aiortc peer
sending VP8) and an RTSP camera read with GStreamer (decoded in its pipeline), each watched
through WHEP by aiortc clients. Their frames are encoded to H.264 once per stream, only while
watched, in the compute budget; the viewers decode them, and the RTP timestamp of each frame they
get maps back to the pts of that frame's detections event, so the page's boxes land on it. The
encoder's bound (one frame held, the rest skipped and counted) is checked against a busy budget."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from engines.detector import Detector
from engines.media.remux import EncodedPacket
from pipelines.compute import ComputeBudget, ModelClaim, Priority
from pipelines.frames import VideoFrame
from pipelines.mailbox import FrameMailbox
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.config import WebRtcSettings
from realtime.webrtc.live import LiveFeed, LiveView, NotOffered
from realtime.webrtc.live_encode import LIVE_ENCODER, LiveEncoder
from tests.realtime.http.test_whep import TOKEN, Received, live_view, post, recvonly_offer
from tests.support.peer import connect, load_frames
from tests.support.rtsp import RtspServer
from tests.support.service import LiveService, live_service, make_config
from tests.support.sse import read_sse
from tests.support.waiting import wait_until

WEBRTC = {"max_viewers": 3, "allow_local_candidates": True}


class Watcher:
    """A WHEP viewer made by an aiortc client, collecting the frames it decodes."""

    def __init__(self, pc: RTCPeerConnection, location: str) -> None:
        self.pc = pc
        self.location = location
        self.received = Received(pc)

    @classmethod
    async def open(cls, svc: LiveService, stream_id: str) -> Watcher:
        pc = await recvonly_offer()
        status, headers, answer = await post(svc, f"/whep/{stream_id}", pc.localDescription.sdp)
        assert status == 201, answer
        watcher = cls(pc, headers["Location"])
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        return watcher

    @property
    def frames(self) -> list[Any]:
        return self.received.frames

    async def close(self) -> None:
        await self.received.aclose()
        await self.pc.close()


async def frame_pts(svc: LiveService, watcher: Watcher) -> list[float]:
    """The pts of each frame the viewer decoded, from its RTP timestamp and the resource's origin
    (what the page computes from `rtpTimestamp`)."""
    clock = (await svc.call("GET", watcher.location)).body
    origin = clock["rtp_origin"]
    assert isinstance(origin, int), clock
    # aiortc's receiver hands frames with their RTP timestamp less the first one it received.
    receiver = next(t.receiver for t in watcher.pc.getTransceivers() if t.kind == "video")
    first = receiver._RTCRtpReceiver__timestamp_mapper._origin  # type: ignore[attr-defined]
    return [((frame.pts + first - origin) % 2**32) / clock["rtp_clock_rate"] for frame in watcher.frames]


async def metrics_say(svc: LiveService, line: str, within_s: float = 5.0) -> None:
    """/metrics has `line` (it is rendered at most once per RENDER_TTL_S: poll)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while line not in (await svc.call("GET", "/metrics")).body:
        assert asyncio.get_running_loop().time() < deadline, f"/metrics never said {line!r}"
        await asyncio.sleep(0.1)


async def events_until(pts_of: Callable[[], list[float]], newest: float) -> list[float]:
    """The detections events' pts once one at or past `newest` came (a frame's boxes come after it)."""
    await wait_until(lambda: any(p >= newest - 0.0005 for p in pts_of()), 10, f"a detections event at {newest}")
    return pts_of()


def matched(mapped: list[float], event_pts: list[float]) -> int:
    """How many mapped frame times are the pts of a detections event (to the millisecond). Not all:
    the frame loop's mailbox drops frames the detector had no time for, and they have no event;
    a wrong mapping matches none."""
    known = {round(p, 3) for p in event_pts}
    return sum(round(p, 3) in known for p in mapped)


async def assert_mapped(svc: LiveService, stream_id: str, mapped: list[float], event_pts: list[float]) -> None:
    """Some frames match their event, and those that do not are no more than the frames that got no
    event: dropped by the mailbox or failed (how many is this machine's speed, so no share of matches
    is asserted)."""
    hits = matched(mapped, event_pts)
    counters = (await svc.stream(stream_id))["counters"]
    dropped = counters.get("frames_dropped", 0) + counters.get("frames_failed", 0)
    assert hits >= 1 and len(mapped) - hits <= dropped, (hits, len(mapped), dropped, mapped[-5:], event_pts[-5:])


async def test_an_mpeg4_camera_is_encoded_once_for_two_viewers_only_while_watched(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, vtest_avi: Path
) -> None:
    config = make_config(webrtc=WEBRTC, streams=[{"id": "plaza", "url": str(vtest_avi), "audio": False}])
    async with live_service(detector, shared_nats_server.url, config=config, token=TOKEN) as svc:
        await svc.wait_for_state("plaza", "live", within_s=20)
        live = live_view(svc)
        feed = live.feed("plaza")
        encoder = feed.encoder
        assert encoder is not None and feed.codec == "msmpeg4v3" and not feed.forwarding  # MS MPEG-4 v3
        await wait_until(lambda: encoder.seen >= 5, 10, "frames at the idle encoder")
        assert (await svc.call("OPTIONS", "/whep/plaza")).headers["Vidsentry-Live-Video"] == "offered"
        assert encoder.starts == 0 and encoder.encoded == 0 and not encoder.running  # nobody watches: no x264

        events: list[dict[str, Any]] = []
        async with svc.session.get(svc.url + "/api/streams/plaza/events",
                                   headers={"Authorization": f"Bearer {TOKEN}"}) as response:
            reader = asyncio.create_task(read_sse(response, events))
            watchers = [await Watcher.open(svc, "plaza") for _ in range(2)]
            try:
                await wait_until(lambda: all(len(w.frames) >= 15 for w in watchers), 20, "both viewers decoding")
                assert {(w.frames[-1].width, w.frames[-1].height) for w in watchers} == {(768, 576)}
                assert encoder.starts == 1 and live.encoding.running == 1  # one encoder for both

                # Each decoded frame's RTP timestamp maps back to the pts of its detections event.
                for watcher in watchers:
                    mapped = await frame_pts(svc, watcher)
                    detections = await events_until(lambda: [e["data"]["pts"] for e in events
                                                             if e["event"] == "detections"], max(mapped))
                    await assert_mapped(svc, "plaza", mapped, detections)
                await metrics_say(svc, "vidsentry_live_encoders 1.0")
                await metrics_say(svc, 'vidsentry_stream_live_encoder_starts_total{stream="plaza"} 1.0')

                for watcher in watchers:
                    assert (await svc.call("DELETE", watcher.location)).status == 200
                # The last viewer left: the encoder stops at the next frame and encodes no more.
                await wait_until(lambda: not encoder.running, 5, "the encoder to stop")
                encoded, seen = encoder.encoded, encoder.seen
                await wait_until(lambda: encoder.seen >= seen + 5, 10, "more frames at the idle encoder")
                assert encoder.encoded == encoded and live.encoding.running == 0
                await metrics_say(svc, "vidsentry_live_encoders 0.0")

                again = await Watcher.open(svc, "plaza")  # a new viewer starts it again
                watchers.append(again)
                await wait_until(lambda: len(again.frames) >= 3, 20, "the next viewer decoding")
                assert encoder.starts == 2
            finally:
                reader.cancel()
                for watcher in watchers:
                    await watcher.close()


async def test_a_browser_session_plays_through_whep(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, vtest_avi: Path
) -> None:
    frames = load_frames(vtest_avi, count=20, size=(640, 480))
    config = make_config(webrtc=WEBRTC)
    async with live_service(detector, shared_nats_server.url, config=config, token=TOKEN) as svc:
        peer = await connect(svc.session, svc.url, frames=frames, fps=10.0, token=TOKEN)
        watcher: Watcher | None = None
        try:
            stream_id = peer.stream_id
            await peer.wait_for(lambda: len(peer.of_kind("detections")) >= 3, 20, "detections")
            live = live_view(svc)
            assert not live.feed(stream_id).demuxed  # aiortc decoded its VP8: no packets to forward
            watcher = await Watcher.open(svc, stream_id)
            await wait_until(lambda: len(watcher.frames) >= 10, 20, "the viewer decoding")
            assert (watcher.frames[-1].width, watcher.frames[-1].height) == (640, 480)
            mapped = await frame_pts(svc, watcher)
            event_pts = await events_until(lambda: [m["body"]["pts"] for m in peer.of_kind("detections")],
                                           max(mapped))
            await assert_mapped(svc, stream_id, mapped, event_pts)
        finally:
            if watcher is not None:
                await watcher.close()
            await peer.close()


def test_without_live_encoding_a_stream_with_other_packets_is_refused_saying_why() -> None:
    live = LiveView(WebRtcSettings(live_encode=False))
    loop = asyncio.new_event_loop()
    try:
        feed = LiveFeed("cam", loop)
        feed.codec = "mpeg4"
        live._feeds["cam"] = feed
        with pytest.raises(NotOffered, match="mpeg4.*webrtc.live_encode is off"):
            live.feed("cam")
        with pytest.raises(NotOffered, match="webrtc.live_encode is off"):
            live.feed("browser")
    finally:
        loop.close()


def still(seq: int, size: tuple[int, int] = (240, 320)) -> VideoFrame:
    image = np.full((*size, 3), seq * 9 % 255, np.uint8)
    return VideoFrame("cam", seq, seq / 10, 0.0, image)


async def test_frames_that_come_while_the_budget_is_busy_are_skipped_and_counted_never_queued() -> None:
    budget = ComputeBudget(1, {"detector": ModelClaim(Priority.BULK)})
    box = FrameMailbox()
    delivered: list[tuple[float, EncodedPacket]] = []
    wanted = threading.Event()
    encoder = LiveEncoder("cam", box, wanted=wanted.is_set, deliver=lambda t, p: delivered.append((t, p)),
                          max_width=1280, compute=budget)
    run = asyncio.create_task(encoder.run())

    async def put_and_settle(seq: int, condition: Callable[[], bool], what: str) -> None:
        box.put(still(seq))
        await wait_until(condition, 5, what)

    try:
        await put_and_settle(0, lambda: encoder.seen == 1, "an unwatched frame")
        assert not delivered and encoder.starts == 0
        wanted.set()
        await put_and_settle(1, lambda: len(delivered) == 1, "the first encoded frame")
        assert delivered[0][0] == pytest.approx(0.1) and delivered[0][1].keyframe
        grant = budget.acquire("detector")  # the only core is busy: the next frame waits for its turn
        await put_and_settle(2, budget.short, "the encoder waiting for a turn")
        for seq in range(3, 8):  # each replaces the one before it in the mailbox
            box.put(still(seq))
        budget.release(grant)
        await wait_until(lambda: len(delivered) == 3, 5, "frames 2 and 7 encoded")
        assert [t for t, _ in delivered] == pytest.approx([0.1, 0.2, 0.7])
        assert budget.stats[LIVE_ENCODER].turns == 3 and budget.stats[LIVE_ENCODER].waited >= 1
        assert encoder.skipped == 4 and encoder.encoded == 3  # 3..6 never queued: skipped, counted
        assert encoder.counters()["live_encode_cpu_s"] > 0
        wanted.clear()
        await put_and_settle(8, lambda: not encoder.running, "the encoder to stop")
        assert encoder.counters()["live_encoder_running"] == 0 and not encoder.encoder.running
    finally:
        box.close()
        await asyncio.wait_for(run, 5)


async def test_a_camera_read_by_gstreamer_plays_through_whep(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, rtsp_server: RtspServer
) -> None:
    # GStreamer decodes inside its pipeline: the service has the H.264 camera's frames, not its packets.
    stream = {"id": "gst", "url": rtsp_server.url("/test"), "audio": False, "ingest": "gstreamer"}
    config = make_config(webrtc=WEBRTC, streams=[stream])
    async with live_service(detector, shared_nats_server.url, config=config, token=TOKEN) as svc:
        await svc.wait_for_state("gst", "live", within_s=20)
        feed = live_view(svc).feed("gst")
        assert not feed.demuxed and feed.encoder is not None
        watcher = await Watcher.open(svc, "gst")
        try:
            await wait_until(lambda: len(watcher.frames) >= 10, 20, "the viewer decoding")
            assert (watcher.frames[-1].width, watcher.frames[-1].height) == (320, 240)
            assert feed.encoder.starts == 1 and feed.encoder.encoded >= 10
        finally:
            await watcher.close()
