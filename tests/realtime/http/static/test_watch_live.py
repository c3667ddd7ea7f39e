"""The Watch view plays a stream's live video over WHEP in headless Chromium: the sample clip's own
H.264 packets, forwarded, decoded by the browser frame after frame, with each frame's boxes drawn
over it (matched by pts through the RTP clock); a stream whose packets are not forwarded (the
MPEG-4 vtest.avi) plays too, its frames encoded for the viewer while it watches. (The JPEG poll
with its line saying why is in test_page.py, with live encoding off.)"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest_asyncio
from playwright.async_api import Browser, Page

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.http.static.test_page import WIDE, wait_for_boxes
from tests.support.browser import open_page
from tests.support.service import LiveService, live_service, make_config
from tests.support.waiting import wait_until


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def svc(people_detector: Detector, shared_nats_server: EmbeddedNatsServer, sample_clip: Path,
              vtest_avi: Path) -> AsyncIterator[LiveService]:
    config = make_config(
        webrtc={"allow_local_candidates": True},
        streams=[{"id": "plaza", "url": str(sample_clip), "realtime": True, "audio": False},
                 {"id": "avi", "url": str(vtest_avi), "realtime": True, "audio": False}],
    )
    async with live_service(people_detector, shared_nats_server.url, config=config) as live:
        await live.wait_for_state("plaza", "live", min_processed=1)
        await live.wait_for_state("avi", "live", min_processed=1)
        yield live


async def watch_until(page: Page, condition: Callable[[dict[str, Any]], bool], within_s: float,
                      what: str) -> dict[str, Any]:
    """The page's Watch hooks once `condition` holds (polled: the page's CSP forbids the eval that
    wait_for_function uses)."""
    deadline = time.monotonic() + within_s
    while True:
        watch: dict[str, Any] = await page.evaluate("window.vidsentry.watch")
        if condition(watch):
            return watch
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {watch}"
        await page.wait_for_timeout(100)


async def test_the_watch_view_plays_live_video_with_each_frame_s_boxes_on_it(
    svc: LiveService, chromium: Browser, screenshots: Path
) -> None:
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        await page.goto(svc.url + "/#watch")
        await page.click(".stream[data-id=plaza]")
        await page.wait_for_selector("#watch-live.on", timeout=15_000)
        await wait_for_boxes(page, "watch-overlay", within_ms=20_000)
        first = await page.evaluate("window.vidsentry.watch")
        # Frames keep being presented, and boxes are drawn on the frames they belong to (waited for,
        # not slept on: on a loaded machine the page holds frames back as long as their boxes take).
        watch = await watch_until(page, lambda w: w["videoFrames"] > first["videoFrames"] + 5 and w["matched"] > 0
                                  and bool(w["latenciesMs"]), 20, "more frames shown, with their boxes")
        played = await page.evaluate("document.getElementById('watch-video').currentTime")
        assert watch["live"] and watch["fallback"] is None and played > 0
        size = await page.evaluate("[document.getElementById('watch-video').videoWidth, "
                                   "document.getElementById('watch-video').videoHeight]")
        assert size == [768, 576]
        await wait_for_boxes(page, "watch-overlay")  # a frame shown with its boxes, for the picture
        await page.screenshot(path=screenshots / "watch-live.png")
        assert svc.service.live.count == 1

        # MS MPEG-4 v3: not forwarded, so its frames are encoded to H.264 for the viewer, and it
        # plays live as well, each frame with its boxes.
        await page.click(".stream[data-id=avi]")
        watch = await watch_until(page, lambda w: w["streamId"] == "avi" and w["matched"] > 0, 20,
                                  "avi's frames shown with their boxes")
        # Leaving plaza ended its viewer (its DELETE may still be on its way); the one left is avi's.
        await wait_until(lambda: svc.service.live.count == 1, 10, "one viewer: avi's")
        encoder = svc.service.live.feed("avi").encoder
        assert encoder is not None and encoder.running and encoder.encoded > 0
        assert watch["live"] and watch["fallback"] is None
        size = await page.evaluate("[document.getElementById('watch-video').videoWidth, "
                                   "document.getElementById('watch-video').videoHeight]")
        assert size == [768, 576]
        await page.screenshot(path=screenshots / "watch-live-encoded.png")
        await page.click(".stream[data-id=plaza]")
        await page.wait_for_selector("#watch-live.on", timeout=15_000)
        await wait_until(lambda: not encoder.running, 10, "avi's encoder to stop once its viewer left")
        assert await watched.problems() == []
