"""A real headless Chromium for page tests: Debian's build driven by playwright, with a fake
camera (vtest frames as a `.y4m`) and a fake microphone (espeak-ng speech as a `.wav`).

No browser is ever downloaded (`playwright install` is never run): `executable_path` points at
the Debian package's launcher. The flags: fake media devices fed from files, the permission
prompt answered yes, nothing phoning home.

Import the fixtures into a conftest.py. The browser is launched once per test session on the
session's event loop, so tests that use it run on that loop too
(`pytestmark = pytest.mark.asyncio(loop_scope="session")`).
"""

from __future__ import annotations

import subprocess
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, ConsoleMessage, Page, async_playwright

CHROMIUM = Path("/usr/bin/chromium")

CAMERA_SIZE = (640, 480)
CAMERA_FPS = 10
CAMERA_SECONDS = 10
CAMERA_START = 100  # vtest frame where people are spread over the plaza
MICROPHONE_RATE = 48_000
# Plain words: a product name is not in a small model's vocabulary, and captions are scored on this.
SPEECH = "Good morning and welcome. This is the fake microphone of the browser test, speaking clearly."

# Listens for CSP violations from the first script on: an init script is not subject to the CSP.
CSP_PROBE = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(`${event.violatedDirective} ${event.blockedURI}`);
});
"""


def write_y4m(vtest_avi: Path, out: Path) -> Path:
    """vtest frames as 640x480 yuv420p at 10 fps, written as YUV4MPEG2 (header, then per frame
    `FRAME` and the Y, U and V planes): the format Chromium's fake camera plays in a loop."""
    width, height = CAMERA_SIZE
    wanted = CAMERA_FPS * CAMERA_SECONDS
    written = 0
    with av.open(str(vtest_avi)) as container, out.open("wb") as sink:
        sink.write(f"YUV4MPEG2 W{width} H{height} F{CAMERA_FPS}:1 Ip A1:1 C420jpeg\n".encode())
        for index, frame in enumerate(container.decode(video=0)):
            if index < CAMERA_START:
                continue
            planes = frame.reformat(width=width, height=height, format="yuv420p").to_ndarray()
            sink.write(b"FRAME\n")
            sink.write(np.ascontiguousarray(planes).tobytes())  # (H*3/2, W): Y, then U, then V
            written += 1
            if written == wanted:
                break
    if written < wanted:
        raise RuntimeError(f"{vtest_avi} has only {written} frames from {CAMERA_START}")
    return out


def write_speech_wav(out: Path, text: str = SPEECH) -> Path:
    """espeak-ng speech at 48 kHz mono s16 with 1 s of silence at the end (the file loops; the
    silence marks where)."""
    raw = out.with_suffix(".espeak.wav")
    subprocess.run(["espeak-ng", "-w", str(raw), text], check=True, capture_output=True, timeout=30)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=MICROPHONE_RATE)
    chunks: list[np.ndarray] = []
    with av.open(str(raw)) as container:
        for frame in container.decode(audio=0):
            chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    chunks.append(np.zeros(MICROPHONE_RATE, dtype=np.int16))
    raw.unlink()
    with wave.open(str(out), "wb") as sink:
        sink.setnchannels(1)
        sink.setsampwidth(2)
        sink.setframerate(MICROPHONE_RATE)
        sink.writeframes(np.concatenate(chunks).astype("<i2").tobytes())
    return out


@dataclass(frozen=True)
class FakeMedia:
    camera: Path  # .y4m
    microphone: Path  # .wav


def chromium_args(media: FakeMedia) -> list[str]:
    return [
        "--headless=new",
        "--no-sandbox",
        "--use-fake-ui-for-media-stream",  # the permission prompt answers yes
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-video-capture={media.camera}",
        f"--use-file-for-fake-audio-capture={media.microphone}",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
    ]


@dataclass
class WatchedPage:
    """A page with its console errors and CSP violations recorded."""

    page: Page
    console_errors: list[str] = field(default_factory=list)

    async def csp_violations(self) -> list[str]:
        violations: list[str] = await self.page.evaluate("window.__cspViolations || []")
        return violations

    async def problems(self) -> list[str]:
        return self.console_errors + [f"CSP: {v}" for v in await self.csp_violations()]


@asynccontextmanager
async def open_page(browser: Browser, **context_options: object) -> AsyncIterator[WatchedPage]:
    context: BrowserContext = await browser.new_context(**context_options)  # type: ignore[arg-type]
    try:
        await context.add_init_script(CSP_PROBE)
        page = await context.new_page()
        watched = WatchedPage(page)

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                url = message.location.get("url", "")
                watched.console_errors.append(f"{message.text} [{url}]" if url else message.text)

        page.on("console", on_console)
        page.on("pageerror", lambda error: watched.console_errors.append(f"uncaught: {error}"))
        yield watched
    finally:
        await context.close()


async def start_session(page: Page, url: str) -> str:
    """Open the page in Go live, press Start and wait for the connection: the session's stream id."""
    await page.goto(url + "/")
    await page.wait_for_selector("#app:not([hidden])")
    await page.click("#start")
    await page.wait_for_selector('body[data-state="connected"]', timeout=15_000)
    return str(await page.evaluate("window.vidsentry.streamId"))


@pytest.fixture(scope="session")
def fake_media(vtest_avi: Path, tmp_path_factory: pytest.TempPathFactory) -> FakeMedia:
    folder = tmp_path_factory.mktemp("fake-media")
    return FakeMedia(write_y4m(vtest_avi, folder / "camera.y4m"), write_speech_wav(folder / "microphone.wav"))


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (deploy/setup.sh)")
    return CHROMIUM


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def chromium(chromium_path: Path, fake_media: FakeMedia) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(chromium_path), args=chromium_args(fake_media))
        try:
            yield browser
        finally:
            await browser.close()
