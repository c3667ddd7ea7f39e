"""Scene descriptions on the page, in a real headless Chromium, with the vLLM simulator as the
service's VLM: Watch mode shows a stream's newest description as the events bring it, and a
stream selected again shows the last one at once (fetched) before the next arrives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from playwright.async_api import Browser

from engines.detector import Detector
from engines.vlm.client import VlmSettings, create_vlm_client
from pipelines.describe.settings import DescribeEngine, DescribeSettings
from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.http.static.test_page import WIDE
from tests.support.browser import open_page, start_session
from tests.support.service import LiveService, live_service
from tests.support.vllm_sim import VllmSimulator

SETTINGS = DescribeSettings(min_interval_s=0.5, max_interval_s=1.0, describe_interval_s=1.0)


def answer(body: dict[str, Any]) -> str:
    turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
    text = f"Description {turns + 1}: people cross a square."
    return json.dumps({"description": text, "people": 3, "activity": "walking", "unusual": False})


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def svc(
    people_detector: Detector, shared_nats_server: EmbeddedNatsServer, vtest_avi: Path
) -> AsyncIterator[LiveService]:
    async with VllmSimulator(answer=answer) as sim:
        client = create_vlm_client(VlmSettings(endpoints=(sim.url,), model=sim.model))
        engine = DescribeEngine(client, sim.model, SETTINGS)
        try:
            async with live_service(people_detector, shared_nats_server.url, describe=engine) as live:
                for stream_id in ("lobby", "yard"):
                    body = {"id": stream_id, "url": str(vtest_avi), "detect_fps": 2, "audio": False}
                    assert (await live.call("POST", "/api/streams", json_body=body)).status == 201
                yield live
        finally:
            await client.aclose()


async def test_watch_mode_shows_the_newest_description(svc: LiveService, chromium: Browser, screenshots: Path) -> None:
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        await page.goto(svc.url + "/#watch")
        await page.wait_for_selector("#app:not([hidden])")
        await page.click(".stream[data-id=lobby]")
        await page.wait_for_selector("#watch-scene[data-described]", timeout=20_000)
        first = await page.text_content("#watch-scene")
        assert first and first.startswith("Description ") and first.endswith("people cross a square.")
        meta = await page.text_content("#watch-scene-meta") or ""
        assert "cached" in meta and "frame" in meta
        # The next one replaces it (one description shown, the newest).
        for _ in range(60):
            now = await page.text_content("#watch-scene")
            if now != first:
                break
            await page.wait_for_timeout(250)
        assert now != first and now and now.startswith("Description ")
        await page.screenshot(path=screenshots / "watch-scene.png", full_page=True)

        await page.click(".stream[data-id=yard]")
        await page.wait_for_selector("#watch-scene[data-described]", timeout=20_000)
        # Shown from GET /api/streams/lobby/description without waiting for the next event: lobby's
        # events are refused from here on, so only the GET can fill the card.
        await page.route("**/api/streams/lobby/events*", lambda route: route.abort())
        await page.click(".stream[data-id=lobby]")
        await page.wait_for_selector("#watch-scene[data-described]", timeout=10_000)
        assert (await page.text_content("#watch-scene") or "").startswith("Description ")
        reply = await svc.call("GET", "/api/streams/lobby/description")
        assert reply.status == 200 and reply.body["description"]["text"].startswith("Description ")
        # Chromium logs every 4xx fetch: frames asked for before a stream had one are expected,
        # and the refused event reads of lobby.
        problems = [
            p
            for p in await watched.problems()
            if not ("404" in p and p.endswith("/frame.jpg]")) and "/api/streams/lobby/events" not in p
        ]
        assert problems == []


async def test_go_live_shows_the_description_of_the_browsers_own_camera(
    svc: LiveService, chromium: Browser, screenshots: Path
) -> None:
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        stream_id = await start_session(page, svc.url)
        await page.wait_for_selector("#live-scene[data-described]", timeout=20_000)
        assert (await page.text_content("#live-scene") or "").startswith("Description ")
        latest = (await svc.call("GET", f"/api/streams/{stream_id}/description")).body["description"]
        assert latest and latest["text"].startswith("Description ")
        await page.screenshot(path=screenshots / "go-live-scene.png")
        await page.click("#stop")
        assert await page.evaluate("document.body.dataset.state") == "closed"
        assert await watched.problems() == []
