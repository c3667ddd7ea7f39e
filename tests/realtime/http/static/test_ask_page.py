"""The Ask tab in a real headless Chromium: a question typed on the page is answered as the model
writes it (the vLLM simulator, streamed), the checked answer's citation is a button, and pressing
it opens the clip that covers that moment, seeked to it. Search lists hits with their matches
marked (as text, never as HTML)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from playwright.async_api import Browser

from engines.detector import Detector
from engines.vlm.client import VlmSettings, create_vlm_client
from pipelines.clips.capability import open_clips
from pipelines.clips.engine import CLIPS
from pipelines.describe.settings import DescribeEngine
from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.http.static.test_page import WIDE
from tests.realtime.timeline.bodies import caption
from tests.support.browser import open_page
from tests.support.service import LiveService, live_service, make_config
from tests.support.vllm_sim import VllmSimulator
from tests.support.waiting import wait_until

ANSWER = "Someone said the parcel was left by the bench [E1]."
# Every text the answer shows, as it changes (an init script: not subject to the page's CSP).
ANSWER_TEXTS = """
window.__answerTexts = [];
new MutationObserver(() => {
  const answer = document.getElementById("ask-answer");
  const text = answer ? answer.textContent : "";
  const texts = window.__answerTexts;
  if (texts.length < 500 && text !== texts[texts.length - 1]) texts.push(text);
}).observe(document, { subtree: true, childList: true, characterData: true });
"""


def answer_or_check(body: dict[str, Any]) -> str:
    if (body.get("response_format") or {}).get("type") == "json_schema":
        return json.dumps({"verdicts": [{"claim": 1, "evidence": "E1", "supported": True}]})
    return ANSWER


@pytest_asyncio.fixture(loop_scope="session")
async def svc(people_detector: Detector, nats_server: EmbeddedNatsServer, sample_clip: Path,
              tmp_path: Path) -> AsyncIterator[LiveService]:
    config = make_config(clips={"enabled": True, "dir": str(tmp_path / "clips")})
    async with VllmSimulator(answer=answer_or_check, per_token_s=0.02) as sim:
        client = create_vlm_client(VlmSettings(endpoints=(sim.url,), model=sim.model, max_retries=0))
        try:
            async with open_clips(config.clips) as engine, \
                    live_service(people_detector, nats_server.url, config=config, opened={CLIPS.name: engine},
                                 describe=DescribeEngine(client, sim.model), timeline=True) as live:
                body = {"id": "plaza", "url": str(sample_clip), "realtime": True, "audio": False, "describe": False}
                assert (await live.call("POST", "/api/streams", json_body=body)).status == 201
                await live.wait_for_state("plaza", "live", within_s=30, min_processed=45)
                made = await live.call("POST", "/api/streams/plaza/clips", json_body={"start": 0.0, "end": 4.0})
                assert made.status == 201, made
                # What was said at 2.0 s of the camera (as a caption final would say it).
                await live.service.publisher.publish(
                    caption("plaza", "q1", "the parcel was left by the bench.", 2.0, at=time.time()))
                timeline = live.service.timeline
                assert timeline is not None
                await wait_until(lambda: timeline.index.stats.entries >= 2, 10, "the caption and the clip indexed")
                yield live
        finally:
            await client.aclose()


async def test_a_question_is_answered_with_a_citation_that_opens_the_clip_at_its_moment(
    svc: LiveService, chromium: Browser, screenshots: Path
) -> None:
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        await page.add_init_script(ANSWER_TEXTS)
        await page.goto(svc.url + "/#ask")
        await page.wait_for_selector("#app:not([hidden])")
        await page.fill("#ask-input", "where was the parcel left?")
        await page.click("#ask-ask")
        await page.wait_for_selector("#ask-answer button.cite", timeout=15_000)
        # Streamed: part of the answer showed before the whole (a token every 20 ms), whenever this
        # test happened to look.
        texts: list[str] = await page.evaluate("window.__answerTexts")
        assert any(t and t != ANSWER and ANSWER.startswith(t) for t in texts), texts
        assert await page.text_content("#ask-answer") == "Someone said the parcel was left by the bench E1."
        assert "every citation holds" in (await page.text_content("#ask-status") or "")
        assert "plaza · captions" in (await page.text_content("#ask-hits") or "")
        await page.click("#ask-answer button.cite")
        await page.wait_for_selector("#ask-box:not([hidden])", timeout=10_000)
        for _ in range(100):  # seeked to the word's time in the clip (2.0 s + the clip's start)
            at = await page.evaluate("document.querySelector('#ask-video').currentTime")
            if at >= 2.0:
                break
            await page.wait_for_timeout(100)
        assert 2.0 <= at < 4.5, at
        assert "at 2." in (await page.text_content("#ask-info") or "")
        source = await page.evaluate("document.querySelector('#ask-video').currentSrc")
        assert "/api/clips/" in source and source.endswith(".mp4"), source  # streamed, not a blob
        await page.screenshot(path=screenshots / "ask.png", full_page=True)

        await page.fill("#ask-input", '"parcel was left"')
        await page.click("#ask-search")
        await page.wait_for_selector("#ask-hits mark", timeout=10_000)
        assert await page.text_content("#ask-hits mark") == "parcel was left"
        assert await page.is_hidden("#ask-answer")
        problems = [p for p in await watched.problems() if not ("404" in p and p.endswith("/frame.jpg]"))]
        assert problems == []
    # While the camera's buffer holds the moment, a hit links the picture on screen then.
    found = await svc.call("GET", "/api/search?q=parcel&stream=plaza")
    hit = found.body["hits"][0]
    assert hit["links"]["frame"] == f"/api/streams/plaza/frame.jpg?pts={hit['pts']:.3f}", hit
    async with svc.session.get(svc.url + hit["links"]["frame"]) as still:
        assert still.status == 200 and abs(float(still.headers["X-Frame-Pts"]) - hit["pts"]) <= 0.11
