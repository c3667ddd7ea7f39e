"""Clips on the page, in a real headless Chromium: a camera's clip (cut on request from the sample
played in real time) is listed under the selected stream, plays in a <video> whose time advances,
with the clip's boxes drawn over it in step with that time, and what was said of it (the alert in
its span, the scene descriptions from the vLLM simulator) listed beside it. The service wants a
token, which a <video src> cannot send: the player streams the clip from a signed link."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from playwright.async_api import Browser

from engines.detector import Detector
from engines.vlm.client import VlmSettings, create_vlm_client
from pipelines.clips.capability import open_clips
from pipelines.clips.engine import CLIPS
from pipelines.describe.settings import DescribeEngine, DescribeSettings
from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.http.static.test_page import TOKEN, WIDE
from tests.support.browser import open_page
from tests.support.service import LiveService, live_service, make_config
from tests.support.vllm_sim import VllmSimulator


@pytest_asyncio.fixture(loop_scope="session")
async def svc(people_detector: Detector, shared_nats_server: EmbeddedNatsServer, sample_clip: Path,
              tmp_path: Path) -> AsyncIterator[LiveService]:
    config = make_config(clips={"enabled": True, "dir": str(tmp_path / "clips")})
    describe = DescribeSettings(min_interval_s=0.5, max_interval_s=1.0, describe_interval_s=1.0, max_frames=8)
    async with VllmSimulator(latency_s=0.05) as sim:
        client = create_vlm_client(VlmSettings(endpoints=(sim.url,), model=sim.model, max_retries=0))
        try:
            async with open_clips(config.clips) as engine, \
                    live_service(people_detector, shared_nats_server.url, config=config, opened={CLIPS.name: engine},
                                 describe=DescribeEngine(client, sim.model, describe), token=TOKEN) as live:
                body = {"id": "plaza", "url": str(sample_clip), "realtime": True, "audio": False,
                        "rules": [{"id": "people", "type": "present", "classes": ["Normal"], "for_s": 0.5}]}
                assert (await live.call("POST", "/api/streams", json_body=body)).status == 201
                await live.wait_for_state("plaza", "live", within_s=30, min_processed=45)
                made = await live.call("POST", "/api/streams/plaza/clips", json_body={"start": 0.0, "end": 4.0})
                assert made.status == 201, made
                yield live
        finally:
            await client.aclose()


async def test_a_clip_plays_on_the_page_with_its_boxes_in_step(
    svc: LiveService, chromium: Browser, screenshots: Path
) -> None:
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        await page.goto(svc.url + "/#watch")
        await page.fill("#token-input", TOKEN)
        await page.click("#token-form button[type=submit]")
        await page.wait_for_selector("#app:not([hidden])")
        await page.click(".stream[data-id=plaza]")
        await page.wait_for_selector("button.clip", timeout=10_000)
        assert "on request" in (await page.text_content("button.clip") or "")
        await page.click("button.clip")
        await page.wait_for_selector("#clip-box.on", timeout=10_000)
        # The video plays (muted) and the overlay follows its time with the clip's boxes.
        for _ in range(150):  # (wait_for_function evaluates a string: the page's CSP forbids it)
            now = await page.evaluate("document.querySelector('#clip-video').currentTime")
            boxes = int(await page.get_attribute("#clip-overlay", "data-boxes") or "0")
            if now > 1.0 and boxes > 0:
                break
            await page.wait_for_timeout(100)
        assert now > 1.0 and boxes > 0, (now, boxes)
        # Streamed from a signed link (the browser seeks by Range), not downloaded whole first.
        source = await page.evaluate("document.querySelector('#clip-video').currentSrc")
        assert "/api/clips/" in source and ".mp4?exp=" in source and "&sig=" in source, source
        async with svc.session.get(source, headers={"Range": "bytes=0-9"}) as part:  # the link alone opens it
            assert part.status == 206 and len(await part.read()) == 10
        other = source.replace("/api/clips/", "/api/clips/0").replace(".mp4?", "x.mp4?")  # another path
        for tampered in (source.replace("&sig=", "&sig=A"), source.replace("?exp=", "?exp=9"), other):
            async with svc.session.get(tampered) as refused:
                body = await refused.json()
                assert refused.status == 401 and "signed link" in body["detail"], (tampered, body)
        drawn_at = float(await page.get_attribute("#clip-overlay", "data-time") or "nan")
        later = await page.evaluate("document.querySelector('#clip-video').currentTime")
        assert 0.0 < drawn_at <= later + 0.1
        info = await page.text_content("#clip-info") or ""
        assert "h264 768x576" in info and "frames of boxes" in info
        # What was said of it beside the player: the alert in its span and the scene descriptions.
        said = await page.eval_on_selector_all("#clip-said li", "items => items.map(i => i.textContent)")
        assert any("alert people (Normal)" in line for line in said), said
        assert any("parking lot" in line for line in said), said
        await page.screenshot(path=screenshots / "watch-clip.png", full_page=True)
        # (The first load's probe without the token is refused, as on any page load before it is given.)
        problems = [p for p in await watched.problems() if not ("404" in p and p.endswith("/frame.jpg]"))
                    and not ("401" in p and p.endswith("/api/streams]"))]
        assert problems == []
