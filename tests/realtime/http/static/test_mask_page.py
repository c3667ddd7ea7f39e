"""Masks on the page: the service with a (tiny, real ONNX) SAM segmenter configured, vtest's plaza
watched in Chromium; the masks of tracked people are filled in inside their boxes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest_asyncio
from playwright.async_api import Browser

from engines.detector import Detector
from pipelines.detect import DetectionBatcher
from pipelines.segment.capability import open_segmentation
from pipelines.segment.engine import SEGMENTATION
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from realtime.service.service import Service
from tests.engines.segment import models
from tests.support.browser import open_page
from tests.support.service import LiveService, make_config
from tests.support.waiting import wait_until


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def svc(
    people_detector: Detector, shared_nats_server: EmbeddedNatsServer, vtest_avi: Path, tmp_path_factory
) -> AsyncIterator[LiveService]:
    root = tmp_path_factory.mktemp("sam")
    segmentation = {
        "enabled": True,
        "sam_encoder": str(models.encoder(root / "encoder.onnx")),
        "sam_decoder": str(models.sam_decoder(root / "decoder.onnx")),
        "backend": "onnx-cpu",
    }
    config = make_config(segmentation=segmentation, webrtc={"live_encode": False})  # masks on the poll's canvas
    async with (
        NatsEventPublisher(shared_nats_server.url, node="test") as publisher,
        DetectionBatcher(people_detector) as batcher,
        open_segmentation(config.segmentation) as segment,
    ):
        service = Service(config, batcher, publisher, opened={SEGMENTATION.name: segment} if segment else {})
        stop, listening = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(service.run("127.0.0.1", 0, stop, on_listening=lambda _: listening.set()))
        try:
            await wait_until(lambda: listening.is_set() or task.done(), 10, "the service to listen")
            assert service.url is not None
            async with aiohttp.ClientSession() as session:
                live = LiveService(service, service.url, session)
                body = {"id": "plaza", "url": str(vtest_avi), "detect_fps": 4, "audio": False}
                assert (await live.call("POST", "/api/streams", json_body=body)).status == 201
                await live.wait_for_state("plaza", "live", min_processed=1)  # a frame.jpg to show at once
                yield live
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


async def test_watch_mode_fills_masks_inside_boxes(svc: LiveService, chromium: Browser, screenshots: Path) -> None:
    async with open_page(chromium, viewport={"width": 1280, "height": 900}) as watched:
        page = watched.page
        await page.goto(svc.url + "/#watch")
        await page.click("#tab-watch")
        await page.click("#streams .stream[data-id=plaza]")
        await page.wait_for_selector('#watch-canvas[data-masks]:not([data-masks="0"])', timeout=30_000)
        # Read together: both are set by one draw, and the next draw may come between two reads.
        masks, boxes = await page.evaluate(
            "(({ masks, boxes }) => [Number(masks), Number(boxes)])(document.getElementById('watch-canvas').dataset)"
        )
        assert 0 < masks <= boxes
        await page.wait_for_timeout(500)
        await page.screenshot(path=screenshots / "watch-masks.png")
        assert not await watched.problems()
    counters = svc.service.registry.runner("plaza").graph.counters()  # type: ignore[union-attr]
    assert counters["masks"] > 0 and counters["masks_failed"] == 0
