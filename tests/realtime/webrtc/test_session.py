"""The session's inactivity watch on the event loop alone (no peer connected): a stall of the loop
is not taken for the peer's silence, and real silence still ends the session."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from aiortc import RTCPeerConnection

from realtime.config import WebRtcSettings
from realtime.webrtc.session import WebRtcSession
from tests.support.waiting import wait_until

LIMIT_S = 0.4  # webrtc.inactivity_timeout_s; the watch looks every LIMIT_S / 4


@contextlib.contextmanager
def no_listener(_stream_id: str, _listener: Any) -> Iterator[None]:
    yield


class Outputs:
    def status(self, _change: object) -> None:
        pass


async def watched_session() -> tuple[WebRtcSession, list[str], asyncio.Task[None], RTCPeerConnection]:
    pc = RTCPeerConnection()
    session = WebRtcSession(
        "browser-1", pc, settings=WebRtcSettings(inactivity_timeout_s=LIMIT_S), listen=no_listener,
        on_end=lambda _s: None,
    )
    reasons: list[str] = []
    session.close = reasons.append  # type: ignore[method-assign,assignment]
    session._connected.set()
    session.stats.last_media_at = time.monotonic()
    watch = asyncio.ensure_future(session._watch(Outputs()))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # it is connected and sleeps until its first look
    return session, reasons, watch, pc


async def test_media_held_up_by_a_stalled_loop_is_not_silence() -> None:
    session, reasons, watch, pc = await watched_session()
    try:
        def arrives() -> None:
            session.stats.last_media_at = time.monotonic()

        # The loop is held longer than the limit; the media the peer sent meanwhile is delivered
        # a moment after the watch's timer has run.
        time.sleep(LIMIT_S * 1.5)  # noqa: ASYNC251 -- the stall is the point
        asyncio.get_running_loop().call_later(0.02, arrives)
        await asyncio.sleep(LIMIT_S)  # more than one look of the watch after the stall
        assert reasons == [] and not watch.done()
    finally:
        watch.cancel()
        await pc.close()


async def test_real_silence_ends_the_session() -> None:
    _session, reasons, watch, pc = await watched_session()
    try:
        await wait_until(lambda: bool(reasons), 10, "the session to end for silence")
        assert reasons == [f"no media for {LIMIT_S:g} s (webrtc.inactivity_timeout_s)"]
        assert watch.done()
    finally:
        watch.cancel()
        await pc.close()
