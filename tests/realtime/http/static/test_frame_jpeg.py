"""`GET /api/streams/{id}/frame.jpg` against the real service: the newest processed frame as
JPEG, encoded once per window however many viewers ask."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import cv2
import numpy as np
import pytest
import pytest_asyncio

from engines.detector import Detector
from pipelines.frames import VideoFrame
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.http.preview import ENCODE_WINDOW_S, PREVIEWS, FramePreviews, encode_jpeg
from tests.support.service import LiveService, live_service
from tests.support.waiting import wait_until

UNREACHABLE = "rtsp://127.0.0.1:1/cam"  # refused at once: the stream never has a frame


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def svc(people_detector: Detector, shared_nats_server: EmbeddedNatsServer) -> AsyncIterator[LiveService]:
    async with live_service(people_detector, shared_nats_server.url) as live:
        yield live


def previews(svc: LiveService) -> FramePreviews:
    return svc.service.app[PREVIEWS]


async def add_vtest(svc: LiveService, stream_id: str, vtest_avi: Path) -> None:
    body = {"id": stream_id, "url": str(vtest_avi), "detect_fps": 4, "audio": False}
    assert (await svc.call("POST", "/api/streams", json_body=body)).status == 201
    await svc.wait_for_state(stream_id, "live", min_processed=1)


def last_frame(svc: LiveService, stream_id: str) -> VideoFrame:
    runner = svc.service.registry.runner(stream_id)
    assert runner is not None and runner.frame_loop is not None
    frame = runner.frame_loop.last_frame
    assert frame is not None
    return frame


async def get_jpeg(svc: LiveService, stream_id: str) -> tuple[int, dict[str, str], bytes]:
    async with svc.session.get(f"{svc.url}/api/streams/{stream_id}/frame.jpg") as response:
        return response.status, dict(response.headers), await response.read()


def decode(jpeg: bytes) -> np.ndarray:
    """JPEG bytes as an RGB image."""
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None, "not a JPEG"
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def test_the_jpeg_is_the_frame_in_its_colours() -> None:
    image = np.zeros((48, 64, 3), np.uint8)
    image[:, :32] = (220, 30, 30)  # red left half, blue right half (RGB)
    image[:, 32:] = (30, 30, 220)
    preview = encode_jpeg(VideoFrame("s", 7, 1.25, 0.0, image))
    decoded = decode(preview.jpeg)
    assert decoded.shape == image.shape and (preview.seq, preview.pts) == (7, 1.25)
    assert np.abs(decoded.astype(int) - image).mean() < 4


async def test_unknown_streams_and_bad_ids_are_json_errors(svc: LiveService) -> None:
    reply = await svc.call("GET", "/api/streams/nowhere/frame.jpg")
    assert reply.status == 404 and reply.body == {"error": "unknown stream", "detail": {"id": "nowhere"}}
    reply = await svc.call("GET", "/api/streams/no%20such/frame.jpg")
    assert reply.status == 400 and reply.body["error"] == "invalid stream id"


async def test_a_stream_without_a_processed_frame_is_404_no_frame_yet(svc: LiveService) -> None:
    assert (await svc.call("POST", "/api/streams", json_body={"id": "dark", "url": UNREACHABLE})).status == 201
    for _ in range(3):  # pending, connecting, reconnecting: never a frame
        reply = await svc.call("GET", "/api/streams/dark/frame.jpg")
        assert reply.status == 404 and reply.body["error"] == "no frame yet", reply
        assert reply.body["detail"]["id"] == "dark"
        await asyncio.sleep(0.3)
    assert (await svc.call("DELETE", "/api/streams/dark")).status == 204


async def test_the_newest_processed_frame_as_jpeg(svc: LiveService, vtest_avi: Path) -> None:
    await add_vtest(svc, "plaza", vtest_avi)
    for _ in range(20):
        status, headers, body = await get_jpeg(svc, "plaza")
        assert status == 200 and headers["Content-Type"] == "image/jpeg"
        assert headers["Cache-Control"] == "no-store"
        frame = last_frame(svc, "plaza")
        if int(headers["X-Frame-Seq"]) == frame.seq:
            break
        await asyncio.sleep(ENCODE_WINDOW_S)
    else:
        raise AssertionError("the JPEG never showed the newest processed frame")
    assert float(headers["X-Frame-Pts"]) == pytest.approx(frame.pts, abs=1e-3)
    rgb = decode(body)
    assert rgb.shape == frame.image.shape  # 576 x 768 x 3, as the detector saw it
    assert np.abs(rgb.astype(int) - frame.image).mean() < 6  # the same picture, JPEG-close


async def test_concurrent_viewers_share_one_encode_per_window(svc: LiveService, vtest_avi: Path) -> None:
    await add_vtest(svc, "crowd", vtest_avi)
    cache = previews(svc)
    # The window is the cache's to decide, not the machine's speed: held open while the viewers
    # ask, then closed at once for the step after it.
    cache.window_s = 3600.0
    try:
        before = cache.encodes
        replies = await asyncio.gather(*(get_jpeg(svc, "crowd") for _ in range(8)))
        assert cache.encodes == before + 1
        assert {r[0] for r in replies} == {200}
        assert len({r[1]["X-Frame-Seq"] for r in replies}) == 1 and len({r[2] for r in replies}) == 1

        # Within the window the same JPEG again, even with a newer frame processed meanwhile.
        first_seq = int(replies[0][1]["X-Frame-Seq"])
        await wait_until(lambda: last_frame(svc, "crowd").seq > first_seq, 10, "a newer processed frame")
        status, headers, _ = await get_jpeg(svc, "crowd")
        assert status == 200 and int(headers["X-Frame-Seq"]) == first_seq and cache.encodes == before + 1

        # After the window, the newer frame is encoded (once).
        cache.window_s = 0.0
        status, headers, _ = await get_jpeg(svc, "crowd")
        assert status == 200 and int(headers["X-Frame-Seq"]) > first_seq and cache.encodes == before + 2
    finally:
        cache.window_s = ENCODE_WINDOW_S


async def test_a_viewer_that_leaves_mid_encode_does_not_cancel_it_for_the_others(
    svc: LiveService, vtest_avi: Path
) -> None:
    await add_vtest(svc, "leaver", vtest_avi)
    await asyncio.sleep(ENCODE_WINDOW_S)
    cache, registry = previews(svc), svc.service.registry
    runner = registry.runner("leaver")
    assert runner is not None
    before = cache.encodes
    leaving = asyncio.create_task(cache.latest("leaver", runner, registry))
    await asyncio.sleep(0)  # it has started the encode and waits for it
    staying = asyncio.create_task(cache.latest("leaver", runner, registry))
    leaving.cancel()
    preview = await staying
    assert preview is not None and preview.jpeg[:2] == b"\xff\xd8" and cache.encodes == before + 1
    with pytest.raises(asyncio.CancelledError):
        await leaving


async def test_the_cache_holds_only_running_streams(svc: LiveService, vtest_avi: Path) -> None:
    await add_vtest(svc, "brief", vtest_avi)
    assert (await get_jpeg(svc, "brief"))[0] == 200
    for stream_id in ("plaza", "crowd", "leaver", "brief"):
        assert (await svc.call("DELETE", f"/api/streams/{stream_id}")).status == 204
    reply = await svc.call("GET", "/api/streams/brief/frame.jpg")
    assert reply.status == 404 and reply.body["error"] == "unknown stream"
    await add_vtest(svc, "after", vtest_avi)
    assert (await get_jpeg(svc, "after"))[0] == 200
    assert len(previews(svc)) == 1  # making its entry dropped those of the deleted streams
    assert (await svc.call("DELETE", "/api/streams/after")).status == 204
