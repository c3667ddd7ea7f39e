"""The captions card in a real headless Chromium: a caption keeps the language it was heard in
(its element's lang, a tag beside a non-English one) and a transcript's English text is a second
line under it, as plain text."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from playwright.async_api import Browser

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.browser import open_page
from tests.support.service import LiveService, live_service

SHOW = """async () => {
  const { CaptionPanel } = await import("/static/captions.js");
  const list = document.createElement("ol");
  list.className = "captions";
  const empty = document.createElement("p");
  document.body.append(list, empty);
  const panel = new CaptionPanel(list, empty);
  panel.show("captions", {segment_id: "a", text: "Buenos", language: "es"});
  panel.show("captions", {segment_id: "b", text: "días.", language: "es"});
  panel.show("transcript", {utterance_id: "u1", replaces: ["a", "b"], text: "Buenos días.", language: "es"});
  panel.show("translations", {utterance_id: "u1", text: "Good <b>morning</b>.", language: "en",
                              spoken_language: "es"});
  panel.show("translations", {utterance_id: "gone", text: "never shown", language: "en"});
  const spans = [...list.querySelectorAll("span")];
  return {
    spans: spans.map((s) => [s.className, s.lang, s.textContent]),
    bold: list.querySelectorAll("b").length,
    display: getComputedStyle(list.querySelector(".translation")).display,
    tag: getComputedStyle(spans[0], "::before").content,
  };
}"""


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def svc(people_detector: Detector, shared_nats_server: EmbeddedNatsServer) -> AsyncIterator[LiveService]:
    async with live_service(people_detector, shared_nats_server.url) as live:
        yield live


async def test_a_caption_keeps_its_language_and_its_english_line_follows(svc: LiveService, chromium: Browser) -> None:
    async with open_page(chromium) as watched:
        page = watched.page
        await page.goto(svc.url)
        shown: dict[str, Any] = await page.evaluate(SHOW)
        assert shown["spans"] == [
            ["caption final transcript", "es", "Buenos días."],
            ["caption translation", "en", "Good <b>morning</b>."],
        ]
        assert shown["bold"] == 0  # text, never markup
        assert shown["display"] == "block"  # its own line under the transcript
        assert shown["tag"] == '"es"'
        assert await watched.problems() == []
