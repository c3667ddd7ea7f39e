"""The page's cards are declared, not written into it: a capability that only tests know (the probe,
tests/support/probe) declares a card with its own module for its own event kind, and the real
service and a real headless Chromium show it, filled from the DataChannel in Go live and from SSE
in Watch, with no file of the project edited for it. The page serves what is declared and nothing
else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from unittest import mock

import pytest_asyncio
from playwright.async_api import Browser, Page, ViewportSize

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.http import page as page_module
from realtime.service import service as service_module
from realtime.service.plugin import Attached, ServicePlugin
from realtime.service.plugins import SERVICE_PLUGINS
from tests.support import probe
from tests.support.browser import open_page, start_session
from tests.support.service import LiveService, live_service
from tests.support.waiting import wait_until

STATIC = Path(page_module.__file__).with_name("static")
WIDE = ViewportSize(width=1100, height=760)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def svc(
    people_detector: Detector, shared_nats_server: EmbeddedNatsServer, vtest_avi: Path
) -> AsyncIterator[LiveService]:
    # The one registry line a capability adds, made here instead.
    with probe.probe_kind(), mock.patch.object(service_module, "SERVICE_PLUGINS", (*SERVICE_PLUGINS, probe.PLUGIN)):
        async with live_service(people_detector, shared_nats_server.url) as live:
            body = {"id": "plaza", "url": str(vtest_avi), "detect_fps": 2, "audio": False}
            assert (await live.call("POST", "/api/streams", json_body=body)).status == 201
            yield live


async def probe_until_shown(svc: LiveService, page: Page, stream_id: str, selector: str) -> None:
    """Publish probe events until the card shows one: the page's reader may not be attached yet
    when the first goes out (probes are not durable, nothing replays them)."""
    for n in range(40):
        reply = await svc.call("POST", f"/api/probe/{stream_id}", json_body={"text": f"probe {n} of {stream_id}"})
        assert reply.status == 202, reply.body
        if await page.locator(f'{selector}:not([data-count="0"])').count():
            return
        await page.wait_for_timeout(250)
    raise AssertionError(f"{selector} never showed a probe event")


async def test_the_page_serves_the_declared_cards_and_modules_and_nothing_else(svc: LiveService) -> None:
    index = await svc.call("GET", "/")
    assert index.status == 200
    for mode in ("live", "watch"):
        assert (
            f'<section class="card" data-panel="probe" data-mode="{mode}" data-module="/static/probe.js"'
            ' data-kinds="probe">\n  <h2>Probe</h2>\n</section>'
        ) in index.body
    assert index.body.count('data-panel="captions"') == 1 and index.body.count('data-panel="clips"') == 1
    assert '<link rel="modulepreload" href="/static/probe.js">' in index.body
    async with svc.session.get(f"{svc.url}/static/probe.js") as reply:
        assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/javascript")
        assert reply.headers["Cache-Control"] == "no-cache"
        assert await reply.text() == Path(probe.__file__).with_name("probe.js").read_text()
        etag = reply.headers["ETag"]
    async with svc.session.get(f"{svc.url}/static/probe.js", headers={"If-None-Match": etag}) as again:
        assert again.status == 304
    # Every file the page ships is declared (by the page or by a plugin), and nothing beside a
    # declared module is: not the plugin's Python, not a path.
    for file in STATIC.iterdir():
        if file.name != "index.html":
            assert (await svc.call("GET", f"/static/{file.name}")).status == 200, file.name
    for name in ("__init__.py", "..%2Fprobe%2F__init__.py", "probe%2Fprobe.js", "PROBE.JS"):
        missing = await svc.call("GET", f"/static/{name}")
        assert missing.status == 404 and missing.is_json, name


async def test_a_declared_card_shows_its_kind_from_sse_and_from_the_datachannel(
    svc: LiveService, chromium: Browser, screenshots: Path
) -> None:
    async with open_page(chromium, viewport=WIDE) as watched:
        page = watched.page
        await page.goto(svc.url + "/#watch")
        await page.wait_for_selector("#app:not([hidden])")
        card = page.locator('#watch section.card[data-panel="probe"]')
        assert await card.locator("h2").text_content() == "Probe"
        titles = await page.locator("#watch section.card[data-panel] h2").all_text_contents()
        assert titles == ["Scene", "Alerts", "Clips", "Probe"]  # by their declared order
        await page.click(".stream[data-id=plaza]")
        await wait_until(lambda: svc.service.fanout.viewer_count == 1, 10, "the page's SSE reader")
        await probe_until_shown(svc, page, "plaza", "#watch-probe")
        assert (await page.text_content("#watch-probe") or "").endswith(" of plaza")
        await page.screenshot(path=screenshots / "watch-probe.png", full_page=True)
        # The router reaches the view's own kinds and the cards alike: boxes are still drawn.
        await page.wait_for_selector('#watch-canvas:not([data-boxes="0"])', timeout=15_000)

        stream_id = await start_session(page, svc.url)  # Go live, on the same page
        assert await page.locator('#live section.card[data-panel="probe"] h2').text_content() == "Probe"
        await probe_until_shown(svc, page, stream_id, "#live-probe")
        assert (await page.text_content("#live-probe") or "").endswith(f" of {stream_id}")
        await page.screenshot(path=screenshots / "go-live-probe.png")
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
