"""Clips end to end through the service: a real RTSP camera (the test server playing the sample)
raises an alert, the clip is cut from the camera's own packets, and the API lists it, serves it
whole and by Range (206, 416), and refuses what is not a clip."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from engines.detector import Detector
from engines.registry import create_detector
from pipelines.clips.capability import open_clips
from pipelines.clips.engine import CLIPS
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.peer import connect, load_frames
from tests.support.rtsp import RtspServer
from tests.support.service import LiveService, live_service, make_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fall_detector(fall_model: Path) -> Iterator[Detector]:
    detector = create_detector(fall_model, "onnx-cpu")
    yield detector
    detector.close()


@pytest.fixture
async def svc(fall_detector: Detector, shared_nats_server: EmbeddedNatsServer, tmp_path: Path
              ) -> AsyncIterator[LiveService]:
    # The camera's Fall boxes are pixelated in its clips when they leave the service.
    config = make_config(clips={"enabled": True, "dir": str(tmp_path / "clips"), "pre_s": 2.0, "post_s": 1.0,
                                "streams": {"cam": {"redact": ["Fall"]}}})
    async with open_clips(config.clips) as engine, \
            live_service(fall_detector, shared_nats_server.url, config=config, opened={CLIPS.name: engine}) as live:
        yield live


async def test_a_cameras_alert_becomes_a_clip_the_api_lists_and_serves_by_range(
    svc: LiveService, sample_clip: Path, tmp_path: Path
) -> None:
    with RtspServer(clip=sample_clip, log_path=tmp_path / "rtsp.log") as rtsp:
        body = {"id": "cam", "url": rtsp.url("/vtest"), "audio": False,
                "rules": [{"id": "people", "type": "present", "classes": ["Normal"], "for_s": 1.0}]}
        reply = await svc.call("POST", "/api/streams", json_body=body)
        assert reply.status == 201, reply
        deadline = time.monotonic() + 40
        while (await svc.stream("cam"))["counters"]["alerts"] < 1:
            assert time.monotonic() < deadline, "no alert"
            await svc.wait_for_state("cam", "live")
        began = (await svc.stream("cam"))["counters"]["frames_processed"]
        await svc.wait_for_state("cam", "live", min_processed=began + 30)  # a few seconds into the alert
        # Any span still in the buffer, on request (media seconds; the camera's start near 0).
        exported = await svc.call("POST", "/api/streams/cam/clips", json_body={"start": 0.5, "end": 2.5})
        assert exported.status == 201, exported
        made = exported.body
        assert made["alert_ids"] == [] and made["start_pts"] <= 0.5 and made["end_pts"] >= 2.4
        for span, status, error in (({"start": 5, "end": 1}, 409, "end must be after start"),
                                    ({"start": 1000, "end": 1001}, 409, "not in the stream's buffer"),
                                    ({"start": 0, "end": 500}, 409, "clips.max_s"),
                                    ({"start": "0", "end": 1}, 400, "invalid span: start")):
            refused = await svc.call("POST", "/api/streams/cam/clips", json_body=span)
            assert refused.status == status and error in refused.body["error"], (span, refused)
        assert (await svc.call("POST", "/api/streams/nope/clips", json_body={"start": 0, "end": 1})).status == 404
        # The picture on screen at a moment still in the buffer, decoded from the camera's packets.
        async with svc.session.get(svc.url + "/api/streams/cam/frame.jpg?pts=1.55") as still:
            jpeg = await still.read()
            assert still.status == 200 and still.headers["Content-Type"] == "image/jpeg"
            shown = float(still.headers["X-Frame-Pts"])
            assert 1.55 - 0.1 - 1e-3 <= shown <= 1.55 + 1e-3  # the frame on screen then (10 fps)
        picture = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert picture is not None and picture.shape == (576, 768, 3)
        for query, status, error in (("pts=1000", 404, "not in the stream's buffer"), ("pts=abc", 400, "pts"),
                                     ("pts=nan", 400, "pts")):
            refused = await svc.call("GET", f"/api/streams/cam/frame.jpg?{query}")
            assert refused.status == status and error in refused.body["error"], (query, refused)
        assert (await svc.call("DELETE", f"/api/clips/{exported.body['clip_id']}")).status == 204
        assert (await svc.call("DELETE", "/api/streams/cam")).status == 204  # ends the alert: its clip is cut

        listed: list = []

        async def one_clip() -> bool:
            listed[:] = (await svc.call("GET", "/api/clips?stream=cam")).body["clips"]
            return len(listed) == 1

        deadline = time.monotonic() + 20
        while not await one_clip():
            assert time.monotonic() < deadline, "no clip listed"
    clip = listed[0]
    assert clip["stream_id"] == "cam" and clip["codec"] == "h264" and len(clip["alert_ids"]) == 1
    assert clip["duration_s"] > 3.0
    assert (await svc.call("GET", f"/api/clips?alert={clip['alert_ids'][0]}")).body["total"] == 1
    assert (await svc.call("GET", "/api/clips?alert=nope")).body["total"] == 0
    boxes = await svc.call("GET", clip["links"]["boxes"])
    assert boxes.status == 200 and boxes.body["stream_id"] == "cam" and boxes.body["frames"]
    vtt = await svc.call("GET", f"/api/clips/{clip['clip_id']}.vtt")  # no recognizer here: no captions
    assert vtt.status == 404 and vtt.body["error"] == "this clip has no vtt"
    meta = await svc.call("GET", clip["links"]["self"])
    assert meta.status == 200 and meta.body["bytes"] == clip["bytes"]
    assert clip["redact_on_export"] == ["Fall"] and clip["redacted"] is None  # as the camera sent it, until it leaves

    url = svc.url + clip["links"]["mp4"]
    async with svc.session.get(url) as whole:  # the first download re-encodes it with the Fall boxes pixelated
        data = await whole.read()
        assert whole.status == 200 and whole.headers["Content-Type"] == "video/mp4"
    clip = (await svc.call("GET", clip["links"]["self"])).body
    assert clip["redact_on_export"] == [] and clip["redacted"]["classes"] == ["Fall"] and len(data) == clip["bytes"]
    assert clip["redacted"]["kept_tracks"] == clip["alert_tracks"] and clip["redacted"]["source"] is None
    saved = tmp_path / "download.mp4"
    saved.write_bytes(data)
    with av.open(str(saved)) as container:
        frames = list(container.decode(video=0))
    assert frames[0].key_frame and frames[0].time == 0.0 and len(frames) >= 30
    size = clip["bytes"]
    for first, last in ((0, 0), (size // 2, size // 2 + 99), (size - 1, size - 1)):
        async with svc.session.get(url, headers={"Range": f"bytes={first}-{last}"}) as part:
            assert part.status == 206 and await part.read() == data[first:last + 1]
            assert part.headers["Content-Range"] == f"bytes {first}-{last}/{size}"
    async with svc.session.get(url, headers={"Range": f"bytes={size}-{size + 10}"}) as past:
        assert past.status == 416

    redacted = await svc.call("POST", f"/api/clips/{clip['clip_id']}/redact", json_body={"classes": ["Fall"]})
    assert redacted.status == 201, redacted
    assert redacted.body["redacted"]["source"] == clip["clip_id"] and redacted.body["redacted"]["classes"] == ["Fall"]
    metrics = (await svc.call("GET", "/metrics")).body
    assert "vidsentry_clips_redacted_on_export_total 1.0" in metrics
    assert redacted.body["clip_id"] != clip["clip_id"] and redacted.body["links"]["boxes"]
    for body, status in (({"classes": []}, 400), ({"classes": "Fall"}, 400), ({"classes": [1]}, 400), ({}, 400)):
        refused = await svc.call("POST", f"/api/clips/{clip['clip_id']}/redact", json_body=body)
        assert refused.status == status and "classes" in refused.body["error"], (body, refused)
    assert (await svc.call("POST", "/api/clips/" + "e" * 32 + "/redact", json_body={"classes": ["x"]})).status == 404
    assert (await svc.call("DELETE", redacted.body["links"]["self"])).status == 204

    assert (await svc.call("DELETE", clip["links"]["self"])).status == 204
    assert (await svc.call("GET", clip["links"]["self"])).status == 404
    assert (await svc.call("GET", "/api/clips")).body["total"] == 0


async def test_what_is_not_a_clip_is_a_4xx_with_a_reason(svc: LiveService) -> None:
    for path in ("/api/clips/..%2F..%2Fetc%2Fpasswd", "/api/clips/" + "0" * 32, "/api/clips/" + "0" * 32 + ".mp4",
                 "/api/clips/x.mp4", "/api/clips/%00"):
        reply = await svc.call("GET", path)
        assert reply.status == 404 and reply.body["error"] == "unknown clip", (path, reply)
    for query in ("since=abc", "until=inf", "since=nan"):
        reply = await svc.call("GET", f"/api/clips?{query}")
        assert reply.status == 400 and "epoch seconds" in reply.body["error"], (query, reply)
    assert (await svc.call("DELETE", "/api/clips/" + "f" * 32)).status == 404


async def test_with_clips_off_the_routes_say_so_instead_of_not_existing(
    fall_detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    async with live_service(fall_detector, shared_nats_server.url) as live:
        listed = await live.call("GET", "/api/clips?stream=cam")
        assert listed.status == 200 and listed.body == {"clips": [], "total": 0, "enabled": False}
        assert (await live.call("GET", "/api/clips/" + "0" * 32 + ".mp4")).status == 404
        body = {"id": "cam", "url": "rtsp://127.0.0.1:1/none", "audio": False}
        assert (await live.call("POST", "/api/streams", json_body=body)).status == 201
        refused = await live.call("POST", "/api/streams/cam/clips", json_body={"start": 0, "end": 1})
        assert refused.status == 409 and "clips.enabled" in refused.body["error"]
        still = await live.call("GET", "/api/streams/cam/frame.jpg?pts=0.5")
        assert still.status == 409 and "newest frame" in still.body["error"]


async def test_a_browser_sessions_frames_are_encoded_into_a_clip_on_request(
    svc: LiveService, vtest_avi: Path, tmp_path: Path
) -> None:
    """A browser session hands decoded frames only: the clips stage encodes them (H.264, keyframes
    every 2 s of media time) into the same buffer a camera's packets fill, and any span of it is
    exported as for a camera."""
    peer = await connect(svc.session, svc.url, frames=load_frames(vtest_avi, count=30), fps=15.0)
    try:
        await svc.wait_for_state(peer.stream_id, "live", min_processed=75)  # 5 s of media at 15 fps
        exported = await svc.call("POST", f"/api/streams/{peer.stream_id}/clips", json_body={"start": 2.5, "end": 4.5})
        assert exported.status == 201, exported
        clip = exported.body
        assert clip["codec"] == "h264" and (clip["width"], clip["height"]) == (640, 480)
        # From the keyframe at or before the start: one every 2 s of media time.
        assert 0.5 - 1e-3 <= clip["start_pts"] <= 2.5 and clip["end_pts"] >= 4.4
        counters = (await svc.stream(peer.stream_id))["counters"]
        assert counters["clip_frames_encoded"] >= 60 and counters["clip_packets"] >= counters["clip_frames_encoded"] - 1
        async with svc.session.get(svc.url + clip["links"]["mp4"]) as whole:
            data = await whole.read()
            assert whole.status == 200 and len(data) == clip["bytes"]
    finally:
        await peer.close()
    saved = tmp_path / "session.mp4"
    saved.write_bytes(data)
    with av.open(str(saved)) as container:
        frames = list(container.decode(video=0))
    assert frames[0].key_frame and frames[0].time == 0.0
    assert len(frames) >= 0.8 * 15 * (clip["end_pts"] - clip["start_pts"])  # the frames it was sent
    assert frames[-1].time == pytest.approx(clip["end_pts"] - clip["start_pts"], abs=0.1)
    # What it shows is what was sent: the vtest scene (mean brightness of a real picture, not a blank).
    picture = frames[len(frames) // 2].to_ndarray(format="rgb24")
    assert picture.shape == (480, 640, 3) and 40 < picture.mean() < 220 and picture.std() > 20
