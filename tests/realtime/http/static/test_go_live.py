"""Go live from a real headless Chromium: its fake camera (vtest frames) and microphone (espeak
speech) reach the service over WebRTC, the boxes come back over the DataChannel and are drawn
over the local video, and the session ends with Stop and with the page. The page signals with
WHIP (`POST /whip/{stream}`, `DELETE` on its Location)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest_asyncio
from playwright.async_api import Browser, Page

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.http.static.test_page import WIDE, wait_for_boxes
from tests.support.browser import open_page
from tests.support.service import CaptionModels, LiveService, live_service, make_config

GONE_WITHIN_S = 20.0  # the beacon ends it at once; the inactivity timeout would within seconds


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def svc(
    people_detector: Detector, shared_nats_server: EmbeddedNatsServer, caption_models: CaptionModels,
    multilingual_models: CaptionModels,
) -> AsyncIterator[LiveService]:
    # One session at a time, so a second page finds the server full. English by default (tiny.en);
    # a session may name the multilingual base for itself.
    config = make_config(webrtc={"max_sessions": 1})
    async with live_service(people_detector, shared_nats_server.url, config=config, captions=caption_models,
                            more_models={"base": multilingual_models[0]}) as live:
        yield live


async def session_streams(svc: LiveService) -> dict[str, dict[str, object]]:
    reply = await svc.call("GET", "/api/streams")
    assert reply.status == 200
    return {s["id"]: s for s in reply.body["streams"]}


async def wait_gone(svc: LiveService, stream_id: str) -> float:
    started = time.monotonic()
    while stream_id in await session_streams(svc):
        if time.monotonic() - started > GONE_WITHIN_S:
            raise AssertionError(f"session {stream_id} still listed after {GONE_WITHIN_S} s")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def go_live(page: Page) -> str:
    await page.click("#start")
    await page.wait_for_selector('body[data-state="connected"]', timeout=15_000)
    await wait_for_boxes(page, "live-overlay")
    stream_id: str = await page.evaluate("window.vidsentry.streamId")
    assert stream_id
    return stream_id


async def test_go_live_draws_boxes_and_the_session_ends_with_stop_and_with_the_page(
    svc: LiveService, chromium: Browser, screenshots: Path
) -> None:
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        sent: list[tuple[str, str]] = []  # (method, path) of every request the page makes
        page.on("request", lambda request: sent.append((request.method, urlsplit(request.url).path)))
        await page.goto(svc.url + "/")
        await page.wait_for_selector("#app:not([hidden])")

        stream_id = await go_live(page)
        # One signalling path: the page publishes with WHIP, as OBS or GStreamer would.
        assert ("POST", f"/whip/{stream_id}") in sent and not any(path == "/api/webrtc/offer" for _, path in sent)
        session = (await session_streams(svc))[stream_id]
        assert session["kind"] == "webrtc" and "url" not in session
        hooks = await page.evaluate("window.vidsentry")
        assert hooks["state"] == "connected" and hooks["boxesDrawn"] > 0 and hooks["messages"] > 0
        assert int(await page.get_attribute("#live-overlay", "data-frames") or 0) > 0
        # The status line's fps and lag show once a window of frames has been counted ("–" before).
        fps, lag = "", ""
        for _ in range(100):
            fps, lag = await page.text_content("#live-fps") or "", await page.text_content("#live-lag") or ""
            if fps.replace(".", "", 1).isdigit() and float(fps) > 0 and lag.endswith(" ms"):
                break
            await page.wait_for_timeout(100)
        assert fps.replace(".", "", 1).isdigit() and float(fps) > 0 and lag.endswith(" ms"), (fps, lag)
        await page.screenshot(path=screenshots / "go-live.png")

        await page.click("#stop")
        assert await page.evaluate("document.body.dataset.state") == "closed"
        await wait_gone(svc, stream_id)
        assert any(method == "DELETE" and path.startswith(f"/whip/{stream_id}/") for method, path in sent)
        assert not await page.is_visible("#live-notice")  # a stop is not an error

        stream_id = await go_live(page)
        assert await watched.problems() == []
        second = await page.context.new_page()
        await second.goto(svc.url + "/")
        await second.click("#start")
        notice = second.locator("#live-notice", has_text="The server is full: session limit reached")
        await notice.wait_for()
        assert await second.evaluate("document.body.dataset.state") == "error"
        assert await second.is_enabled("#start")  # the camera is released; Start can be pressed again
        await second.close()
        await page.close(run_before_unload=True)  # pagehide: the beacon with the close token
        await wait_gone(svc, stream_id)
    # Stop's DELETE ended the first; the second ended with the page: by its beacon or by its
    # closing DataChannel, whichever reached the server first (a race), not by a timeout.
    ended = dict(svc.service.sessions.ended)
    assert ended.pop("stopped") == 1 and sum(ended.values()) == 1
    assert set(ended) <= {"the page went away", "the page closed its data channel"}, ended


async def test_the_speaker_chooses_their_language_and_an_english_line_before_going_live(
    svc: LiveService, chromium: Browser, screenshots: Path
) -> None:
    """The service captions English; the person picks Spanish and an English line: the WHIP URL
    carries them, and the session is captioned by the multilingual model in Spanish. A choice the
    service cannot serve is refused before the session starts, with the reason on the page."""
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        sent: list[str] = []
        page.on("request", lambda request: sent.append(request.url))
        await page.goto(svc.url + "/")
        await page.wait_for_selector("#app:not([hidden])")
        await page.select_option("#live-language", "es")
        await page.check("#live-translate")
        await page.screenshot(path=screenshots / "go-live-language.png")
        stream_id = await go_live(page)
        posted = next(url for url in sent if urlsplit(url).path == f"/whip/{stream_id}")
        assert urlsplit(posted).query == "captions.model=base&captions.language=es&captions.translate=en", posted
        session = (await session_streams(svc))[stream_id]
        assert session["captions"] == {"model": "base", "language": "es", "translate": "en"}, session
        assert await page.is_disabled("#live-language") and await page.is_disabled("#live-translate")
        await page.click("#stop")
        await wait_gone(svc, stream_id)
        assert await page.is_enabled("#live-language")

        # A code no Whisper model knows (as a hand-edited page could send): refused, said, nothing kept.
        await page.evaluate("document.querySelector('#live-language option[value=ja]').value = 'xx'")
        await page.select_option("#live-language", "xx")
        await page.click("#start")
        await page.locator("#live-notice", has_text="The server refused the session").wait_for()
        assert "captions.language" in (await page.text_content("#live-notice") or "")
        assert await page.evaluate("document.body.dataset.state") == "error"
        assert await session_streams(svc) == {}
        # The browser logs the refused request itself; nothing else went wrong on the page.
        assert all("status of 400" in problem for problem in await watched.problems()), await watched.problems()
