"""The Watch view plays a stream's live video over WHEP in headless Chromium: the sample clip's own
H.264 packets, forwarded, decoded by the browser frame after frame, with each frame's boxes drawn
over it (matched by pts through the RTP clock); a stream whose video is not forwarded falls back to
the JPEG poll with a line saying why."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from playwright.async_api import Browser

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.http.static.test_page import WIDE, wait_for_boxes
from tests.support.browser import open_page
from tests.support.service import LiveService, live_service, make_config


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


async def test_the_watch_view_plays_live_video_with_each_frame_s_boxes_on_it(
    svc: LiveService, chromium: Browser, screenshots: Path
) -> None:
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        await page.goto(svc.url + "/#watch")
        await page.click(".stream[data-id=plaza]")
        await page.wait_for_selector("#watch-live.on", timeout=15_000)
        await wait_for_boxes(page, "watch-overlay", within_ms=20_000)
        await page.wait_for_timeout(800)  # some frames more, so the figures below mean something
        first = await page.evaluate("window.vidsentry.watch")
        await page.wait_for_timeout(600)
        watch = await page.evaluate("window.vidsentry.watch")
        played = await page.evaluate("document.getElementById('watch-video').currentTime")
        assert watch["live"] and watch["fallback"] is None
        assert watch["videoFrames"] > first["videoFrames"] and played > 0  # frames keep being presented
        assert watch["matched"] > 0 and watch["latenciesMs"]  # boxes drawn on the frames they belong to
        size = await page.evaluate("[document.getElementById('watch-video').videoWidth, "
                                   "document.getElementById('watch-video').videoHeight]")
        assert size == [768, 576]
        await wait_for_boxes(page, "watch-overlay")  # a frame shown with its boxes, for the picture
        await page.screenshot(path=screenshots / "watch-live.png")
        assert svc.service.live.count == 1

        await page.click(".stream[data-id=avi]")  # MPEG-4 part 2: not forwarded, the JPEG poll instead
        await wait_for_boxes(page, "watch-canvas", within_ms=15_000)
        fallback = await page.evaluate("window.vidsentry.watch.fallback")
        assert "msmpeg4" in fallback
        assert "No live video" in (await page.text_content("#watch-fallback") or "")
        await page.wait_for_timeout(300)
        assert svc.service.live.count == 0  # leaving the stream ended its viewer (DELETE)
        assert await watched.problems() == []
