"""The page's cards are declared, not written into it: a capability that only tests know (chimes,
tests/support/chimes, installed for these tests in place of its registry line) declares a card
with its own module for its own event kind, and the real service and a real headless Chromium
show it, filled from the DataChannel in Go live and from SSE in Watch, with no file of the project
edited for it. The page serves what is declared and nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from unittest import mock

import pytest_asyncio
from playwright.async_api import Browser, Page, ViewportSize

from engines.detector import Detector
from pipelines.capabilities import CAPABILITIES, installed
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.config import config_model
from realtime.http import page as page_module
from realtime.service import service as service_module
from realtime.service.plugin import Attached, ServicePlugin
from realtime.service.plugins import SERVICE_PLUGINS
from tests.support.browser import open_page, start_session
from tests.support.chimes import plugin as chimes_plugin
from tests.support.chimes.capability import CAPABILITY as CHIMES
from tests.support.service import FAST_SUPERVISOR, OPEN_SOURCES, LiveService, live_service
from tests.support.waiting import wait_until

STATIC = Path(page_module.__file__).with_name("static")
WIDE = ViewportSize(width=1100, height=760)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def svc(
    people_detector: Detector, shared_nats_server: EmbeddedNatsServer, vtest_avi: Path
) -> AsyncIterator[LiveService]:
    with installed(CHIMES):  # the one registry line a capability adds, made here instead
        config = config_model(CAPABILITIES).model_validate(
            {"node": "test", "supervisor": FAST_SUPERVISOR, "sources": OPEN_SOURCES, "chimes": {"every_frames": 2},
             "webrtc": {"live_encode": False}}  # the panel's marks on the JPEG poll's canvas
        )
        opened = {"chimes": config.section("chimes")}
        async with live_service(people_detector, shared_nats_server.url, config=config, opened=opened) as live:
            body = {"id": "plaza", "url": str(vtest_avi), "detect_fps": 2, "audio": False}
            assert (await live.call("POST", "/api/streams", json_body=body)).status == 201
            yield live


async def shown(page: Page, selector: str) -> str:
    """The card's text once it has shown a chime (the stage publishes one every other frame)."""
    await page.wait_for_selector(f'{selector}:not([data-count="0"])', timeout=20_000)
    return await page.text_content(selector) or ""


async def test_the_page_serves_the_declared_cards_and_modules_and_nothing_else(svc: LiveService) -> None:
    index = await svc.call("GET", "/")
    assert index.status == 200
    for mode in ("live", "watch"):
        assert (
            f'<section class="card" data-panel="chimes" data-mode="{mode}" data-module="/static/chimes.js"'
            ' data-kinds="chimes">\n  <h2>Chimes</h2>\n</section>'
        ) in index.body
    assert index.body.count('data-panel="captions"') == 2 and index.body.count('data-panel="clips"') == 1
    assert '<link rel="modulepreload" href="/static/chimes.js">' in index.body
    async with svc.session.get(f"{svc.url}/static/chimes.js") as reply:
        assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/javascript")
        assert reply.headers["Cache-Control"] == "no-cache"
        assert await reply.text() == Path(chimes_plugin.__file__).with_name("chimes.js").read_text()
        etag = reply.headers["ETag"]
    async with svc.session.get(f"{svc.url}/static/chimes.js", headers={"If-None-Match": etag}) as again:
        assert again.status == 304
    # Every file the page ships is declared (by the page or by a plugin), and nothing beside a
    # declared module is: not the plugin's Python, not a path.
    for file in STATIC.iterdir():
        if file.name != "index.html":
            assert (await svc.call("GET", f"/static/{file.name}")).status == 200, file.name
    for name in ("plugin.py", "..%2Fchimes%2Fplugin.py", "chimes%2Fchimes.js", "CHIMES.JS"):
        missing = await svc.call("GET", f"/static/{name}")
        assert missing.status == 404 and missing.is_json, name


async def test_a_declared_card_shows_its_kind_from_sse_and_from_the_datachannel(
    svc: LiveService, chromium: Browser, screenshots: Path
) -> None:
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        await page.goto(svc.url + "/#watch")
        await page.wait_for_selector("#app:not([hidden])")
        card = page.locator('#watch section.card[data-panel="chimes"]')
        assert await card.locator("h2").text_content() == "Chimes"
        titles = await page.locator("#watch section.card[data-panel] h2").all_text_contents()
        assert titles == ["Captions", "Scene", "Alerts", "Clips", "Chimes"]  # by their declared order
        await page.click(".stream[data-id=plaza]")
        await wait_until(lambda: svc.service.fanout.viewer_count == 1, 10, "the page's SSE reader")
        assert (await shown(page, "#watch-chimes")).startswith("bell at frame ")
        await page.screenshot(path=screenshots / "watch-chimes.png", full_page=True)
        # The router reaches the view's own kinds and the cards alike: boxes are still drawn.
        await page.wait_for_selector('#watch-canvas:not([data-boxes="0"])', timeout=15_000)

        stream_id = await start_session(page, svc.url)  # Go live, on the same page
        assert await page.locator('#live section.card[data-panel="chimes"] h2').text_content() == "Chimes"
        assert (await shown(page, "#live-chimes")).startswith("bell at frame ")
        assert stream_id in svc.service.sessions  # the chimes came over its DataChannel
        await page.screenshot(path=screenshots / "go-live-chimes.png")
        await page.click("#stop")
        # Chromium logs every 4xx fetch: frames asked for before plaza had one are expected.
        problems = [p for p in await watched.problems() if not ("404" in p and p.endswith("/frame.jpg]"))]
        assert problems == []


async def test_a_panel_that_fails_to_load_costs_the_others_nothing(
    people_detector: Detector, shared_nats_server: EmbeddedNatsServer, chromium: Browser, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.js"
    broken.write_text("export default function mount() { throw new Error('broken on purpose'); }\n")
    panel = page_module.Panel("broken", "Broken", broken, kinds=("x",))
    plugin = ServicePlugin("broken", lambda _ctx: Attached(), panels=(panel,))
    with mock.patch.object(service_module, "SERVICE_PLUGINS", (*SERVICE_PLUGINS, plugin)):
        async with live_service(people_detector, shared_nats_server.url) as svc, open_page(chromium) as watched:
            page = watched.page
            await page.goto(svc.url + "/")
            await page.wait_for_selector("#app:not([hidden])")
            assert await page.text_content('#live [data-panel="broken"] p') == "This panel could not load."
            assert await page.is_enabled("#start")
            assert any("the broken panel could not load" in p for p in watched.console_errors), watched.console_errors
