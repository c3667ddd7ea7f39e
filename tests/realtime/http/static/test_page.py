"""The page in a real headless Chromium against the real service: it loads clean under the CSP,
Watch mode lists the cameras and draws their boxes, and with a token it asks for it first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from playwright.async_api import Browser, Page, ViewportSize

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.browser import open_page
from tests.support.service import LiveService, live_service, make_config
from tests.support.waiting import wait_until

TOKEN = "page-test-token-1234"
UNREACHABLE = "rtsp://127.0.0.1:1/cam"  # refused at once: a stream that keeps reconnecting
WIDE = ViewportSize(width=1100, height=760)
PHONE = ViewportSize(width=390, height=844)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def svc(
    people_detector: Detector, shared_nats_server: EmbeddedNatsServer, vtest_avi: Path
) -> AsyncIterator[LiveService]:
    # The JPEG poll's canvas is what this module draws on: no stream here gets live video.
    config = make_config(webrtc={"live_encode": False})
    async with live_service(people_detector, shared_nats_server.url, config=config) as live:
        body = {"id": "plaza", "url": str(vtest_avi), "detect_fps": 4, "audio": False}
        assert (await live.call("POST", "/api/streams", json_body=body)).status == 201
        assert (await live.call("POST", "/api/streams", json_body={"id": "gate", "url": UNREACHABLE})).status == 201
        await live.wait_for_state("plaza", "live", min_processed=1)
        yield live


async def canvas_number(page: Page, canvas_id: str, name: str) -> int:
    return int(await page.get_attribute(f"#{canvas_id}", f"data-{name}") or 0)


async def wait_for_boxes(page: Page, canvas_id: str, within_ms: int = 15_000) -> None:
    # Selectors, not wait_for_function: the page's CSP forbids the eval that one uses.
    await page.wait_for_selector(f'#{canvas_id}:not([data-boxes="0"])', timeout=within_ms)


async def test_the_page_and_only_its_files_are_served(svc: LiveService) -> None:
    page = await svc.call("GET", "/")
    assert page.status == 200 and page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert '<script type="module" src="/static/app.js">' in page.body
    assert "<style" not in page.body and " style=" not in page.body and "<script>" not in page.body
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css"), ("icon.svg", "image/svg+xml")):
        async with svc.session.get(f"{svc.url}/static/{name}") as reply:
            assert reply.status == 200 and reply.headers["Content-Type"].startswith(kind), name
            assert reply.headers["Cache-Control"] == "no-cache"
            etag = reply.headers["ETag"]
        async with svc.session.get(f"{svc.url}/static/{name}", headers={"If-None-Match": etag}) as again:
            assert again.status == 304 and again.headers["ETag"] == etag  # revalidated, not sent again
    for name in ("index.html", "nope.js", "..%2Fpage.py", "APP.JS"):
        missing = await svc.call("GET", f"/static/{name}")
        assert missing.status == 404 and missing.is_json, name


async def test_the_page_loads_clean_and_watch_mode_draws_boxes_and_alerts(
    svc: LiveService, chromium: Browser, screenshots: Path, vtest_avi: Path
) -> None:
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        await page.goto(svc.url + "/")
        assert await page.title() == "vidsentry"
        await page.wait_for_selector("#app:not([hidden])")
        assert await page.evaluate("document.body.dataset.state") == "idle"
        assert await page.is_enabled("#start") and not await page.is_enabled("#stop")
        await page.screenshot(path=screenshots / "go-live-idle.png")

        await page.click("#tab-watch")
        await page.wait_for_selector("#streams .stream[data-id=plaza]")
        gate = page.locator(".stream[data-id=gate]")
        assert await gate.locator(".kind").text_content() == "camera"
        assert await gate.locator(".reason").text_content()  # why it is not live, e.g. connection refused
        await page.click(".stream[data-id=plaza]")
        await wait_for_boxes(page, "watch-canvas")
        assert await canvas_number(page, "watch-canvas", "frames") > 0  # detections events read
        hooks = await page.evaluate("window.vidsentry.watch")
        assert hooks["streamId"] == "plaza" and hooks["boxesDrawn"] > 0 and hooks["messages"] > 0
        assert "webrtc.live_encode is off" in hooks["fallback"]  # why the poll, not live video
        size = await page.evaluate(
            "[document.getElementById('watch-canvas').width, document.getElementById('watch-canvas').height]"
        )
        assert size == [768, 576]  # the frame at its own size, scaled by CSS
        await page.wait_for_timeout(600)  # a second frame, so the screenshot shows a settled view
        await page.screenshot(path=screenshots / "watch.png")

        # Another selection aborts the first one's reads: the page reads one stream at a time.
        await page.click(".stream[data-id=gate]")
        await page.wait_for_selector("#watch-placeholder:not([hidden])")
        assert await page.evaluate("window.vidsentry.watch.streamId") == "gate"
        # The server sees plaza's reader go at its next write and gate's come when its request lands.
        fanout = svc.service.fanout
        await wait_until(lambda: fanout.viewers_of("plaza") == 0 and fanout.viewers_of("gate") == 1, what="readers")
        assert svc.service.fanout.viewer_count == 1  # gate's reader; plaza's was aborted

        # Someone is always on the square: once the rule's alert starts, their boxes are warnings,
        # whether the page selects the stream before the alert starts or after (it is told of the
        # alerts still open when it joins).
        rule = {"id": "someone", "type": "present", "classes": ["Normal"], "severity": "critical", "for_s": 4}
        body = {"id": "square", "url": str(vtest_avi), "detect_fps": 4, "audio": False, "rules": [rule]}
        assert (await svc.call("POST", "/api/streams", json_body=body)).status == 201
        await page.click(".stream[data-id=square]")  # once the list shows it
        await page.wait_for_selector('#watch-canvas:not([data-alerted="0"])', timeout=15_000)
        assert await page.locator("#watch-alerts .alert.active", has_text="someone").count() == 1
        await page.screenshot(path=screenshots / "watch-alert.png", full_page=True)

        await page.set_viewport_size(PHONE)
        await page.click(".stream[data-id=plaza]")
        await wait_for_boxes(page, "watch-canvas")
        await page.screenshot(path=screenshots / "watch-phone.png", full_page=True)
        await page.click("#tab-live")
        await page.screenshot(path=screenshots / "go-live-phone.png")
        assert (await svc.call("DELETE", "/api/streams/square")).status == 204
        # Chromium logs every 4xx fetch; the only ones expected are frames asked for before a
        # stream had one (gate never has; square not at first).
        expected = ("/api/streams/gate/frame.jpg]", "/api/streams/square/frame.jpg]")
        problems = [p for p in await watched.problems() if not ("404" in p and p.endswith(expected))]
        assert problems == []


async def test_with_a_token_the_page_asks_for_it_once_and_keeps_it_for_the_tab(
    people_detector: Detector, shared_nats_server: EmbeddedNatsServer, chromium: Browser, screenshots: Path
) -> None:
    async with (
        live_service(people_detector, shared_nats_server.url, token=TOKEN) as svc,
        open_page(chromium, viewport=WIDE) as watched,
    ):
        assert (await svc.call("POST", "/api/streams", json_body={"id": "locked", "url": UNREACHABLE})).status == 201
        page = watched.page
        await page.goto(svc.url + "/#watch")
        await page.wait_for_selector("#token-panel:not([hidden])")
        assert await page.is_hidden("#app")
        assert await page.locator(".stream").count() == 0  # nothing of the streams without the token
        await page.screenshot(path=screenshots / "token.png")

        await page.fill("#token-input", "wrong-token")
        await page.click("#token-form button[type=submit]")
        await page.locator("#token-message", has_text="not accepted").wait_for()
        assert await page.is_hidden("#app")

        await page.fill("#token-input", TOKEN)
        await page.click("#token-form button[type=submit]")
        await page.wait_for_selector("#streams .stream[data-id=locked]")
        assert await page.is_hidden("#token-panel")
        assert await page.evaluate("sessionStorage.getItem('vidsentry.token')") == TOKEN

        await page.reload()  # the same tab: the token is kept, nothing is asked
        await page.wait_for_selector("#streams .stream[data-id=locked]")
        assert await page.is_hidden("#token-panel")
        # Chromium logs each refused fetch: the first load's probe and the wrong guess, nothing after.
        assert len(watched.console_errors) == 2, watched.console_errors
        assert all("401" in e and e.endswith("/api/streams]") for e in watched.console_errors), watched.console_errors
        assert await watched.csp_violations() == []
