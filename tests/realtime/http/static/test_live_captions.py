"""Live captions from a real headless Chromium: its fake microphone (espeak-ng speech, looped)
reaches the service over WebRTC, and the page shows the partials and finals that also go to NATS,
each utterance's transcript in place of its finals once it arrives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest_asyncio
from playwright.async_api import Browser

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.http.static.test_page import WIDE
from tests.support.browser import SPEECH, open_page, start_session
from tests.support.service import CaptionModels, LiveService, live_service, make_config
from tests.support.speech import looped_wer, words_of
from tests.support.waiting import wait_until


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def svc(
    people_detector: Detector, shared_nats_server: EmbeddedNatsServer, caption_models: CaptionModels
) -> AsyncIterator[LiveService]:
    config = make_config()
    async with live_service(people_detector, shared_nats_server.url, config=config, captions=caption_models) as live:
        yield live


async def test_the_page_shows_live_captions_of_the_microphone(
    svc: LiveService, chromium: Browser, shared_nats_server: EmbeddedNatsServer, screenshots: Path
) -> None:
    finals: list[dict[str, Any]] = []
    transcripts: list[dict[str, Any]] = []
    nc = await nats.connect(shared_nats_server.url)

    async def on_final(msg: Any) -> None:
        (finals if msg.subject.endswith(".captions") else transcripts).append(json.loads(msg.data))

    await nc.subscribe("vidsentry.*.captions", cb=on_final)
    await nc.subscribe("vidsentry.*.transcript", cb=on_final)
    try:
        async with open_page(chromium, viewport=WIDE) as watched:
            page = watched.page
            stream_id = await start_session(page, svc.url)
            await page.wait_for_selector("#captions .caption.final", timeout=30_000)
            # Two loops of the phrase: the first words may be cut (playback starts before the connection).
            await wait_until(lambda: len(words_of(" ".join(f["text"] for f in finals))) >= 28, 45, "28 words on NATS")
            assert {f["stream_id"] for f in finals} == {stream_id}
            heard = " ".join(f["text"] for f in finals)
            assert looped_wer(heard, SPEECH) <= 0.30, heard
            # The phrase ends in a second of silence: each loop's utterance is transcribed whole, and
            # the page puts the transcript where its finals were.
            await page.wait_for_selector("#captions .caption.transcript", timeout=30_000)
            await wait_until(lambda: bool(transcripts), 10, "a transcript on NATS")
            first = transcripts[0]
            assert set(first["replaces"]) <= {f["segment_id"] for f in finals}
            assert await page.locator("#captions .caption.transcript").first.text_content() == first["text"]
            for segment_id in first["replaces"][1:]:
                assert await page.locator(f'#captions [data-segment="{segment_id}"]').count() == 0
            kept = " ".join(t["text"] for t in transcripts)
            assert looped_wer(kept, SPEECH) <= 0.30, kept
            await page.screenshot(path=screenshots / "go-live-captions.png")
            assert await watched.problems() == []
            await page.click("#stop")
    finally:
        await nc.close()


async def test_watch_cameras_shows_a_cameras_captions_under_its_frame(
    svc: LiveService, chromium: Browser, sample_clip: Path, screenshots: Path
) -> None:
    body = {"id": "narrated", "url": str(sample_clip), "detect_fps": 2}
    assert (await svc.call("POST", "/api/streams", json_body=body)).status == 201
    try:
        async with open_page(chromium, viewport=WIDE) as watched:
            page = watched.page
            await page.goto(svc.url + "/#watch")
            await page.click(".stream[data-id=narrated]")
            # The same card as Go live's, filled from the stream's server-sent events.
            await page.wait_for_selector("#watch-captions .caption.final", timeout=45_000)
            assert await page.locator("#captions-empty").is_visible() is False  # Go live's card is untouched
            shown = await page.locator("#watch-captions").text_content() or ""
            assert words_of(shown), shown
            await page.screenshot(path=screenshots / "watch-captions.png", full_page=True)
            assert [p for p in await watched.problems() if not p.endswith("/frame.jpg]")] == []
    finally:
        await svc.call("DELETE", "/api/streams/narrated")
