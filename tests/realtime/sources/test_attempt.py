"""The reader side on its own: scripted sessions on real threads, no server, no decoder."""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np
import pytest

from pipelines.frames import VideoFrame
from realtime.sources.attempt import Attempt, Feed
from realtime.sources.session import BackendUnavailable, SourceError, VideoSink
from realtime.sources.spec import parse_source

URL = "rtsp://admin:hunter2@127.0.0.1:8554/cam"


class Frames:
    """A video input that keeps every frame."""

    def __init__(self) -> None:
        self.frames: list[VideoFrame] = []
        self.closed = False

    def put(self, frame: VideoFrame, timeout: float | None = None) -> bool:
        if self.closed:
            return False
        self.frames.append(frame)
        return True

    def close(self) -> None:
        self.closed = True


class Scripted:
    """A session that hands out `frames` images (after `gate`, if given), then ends or raises `error`."""

    def __init__(self, frames: int = 0, *, error: Exception | None = None, gate: threading.Event | None = None) -> None:
        self.frames = frames
        self.error = error
        self.gate = gate
        self.corrupt_packets = 0
        self.kept: list[bool] = []  # what each video_out call answered
        self.closed = False

    def open(self) -> None:
        pass

    def run(self, video_out: VideoSink, audio_out: object, stop: threading.Event, packets_out: object = None) -> None:
        if self.gate is not None:
            self.gate.wait(5)
        for index in range(self.frames):
            self.kept.append(video_out(np.zeros((2, 2, 3), np.uint8), index / 10, 0.0))
            if not self.kept[-1]:
                return
        if self.error is not None:
            raise self.error

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _feed(video: Frames, max_frames: int | None = None) -> tuple[Feed, list[int]]:
    wakes: list[int] = []
    feed = Feed(
        "cam",
        parse_source(URL),
        "pyav",
        video=video,
        audio=None,
        packets=None,
        realtime=False,
        max_frames=max_frames,
        stop_requested=threading.Event(),
        wake=lambda: wakes.append(threading.get_ident()),
    )
    return feed, wakes


async def _ended(attempt: Attempt) -> str | None:
    """The attempt's result (error text, or None at a clean end) once its thread is done."""
    assert attempt.done is not None
    return await asyncio.wait_for(attempt.done, 5)


async def test_frames_are_numbered_across_attempts_up_to_the_frame_limit() -> None:
    video = Frames()
    feed, wakes = _feed(video, max_frames=5)
    loop = asyncio.get_running_loop()
    first = feed.start(1, Scripted(3), 1.0, loop)
    assert await _ended(first) is None
    feed.finished(first)
    assert feed.current is None and feed.end_reason is None
    second = feed.start(2, Scripted(10), 1.0, loop)
    assert await _ended(second) is None
    assert [frame.seq for frame in video.frames] == [0, 1, 2, 3, 4]
    assert (first.frames, second.frames, feed.frames, feed.connects) == (3, 2, 5, 2)
    assert feed.end_reason == "frame limit reached (5 frames)"
    assert wakes and set(wakes) == {threading.get_ident()}  # the loop thread, never a reader


async def test_a_replaced_attempt_delivers_nothing() -> None:
    video = Frames()
    feed, _ = _feed(video)
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    stale_session = Scripted(3, gate=gate)
    stale = feed.start(1, stale_session, 1.0, loop)
    fresh = feed.start(2, Scripted(2), 1.0, loop)
    assert await _ended(fresh) is None
    gate.set()
    assert await _ended(stale) is None
    assert stale_session.kept == [False] and stale.frames == 0 and stale_session.closed
    assert [frame.seq for frame in video.frames] == [0, 1]


@pytest.mark.parametrize(
    ("error", "expected", "permanent"),
    [
        (SourceError(f"cannot open {URL}"), "cannot open rtsp://", False),
        (BackendUnavailable("gstreamer is not installed"), "gstreamer is not installed", True),
        (RuntimeError("boom"), "internal error in the pyav reader: boom", False),
    ],
)
async def test_a_reader_error_resolves_the_attempt_redacted(
    error: Exception, expected: str, permanent: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="realtime.sources.supervisor")
    feed, _ = _feed(Frames())
    session = Scripted(1, error=error)
    session.corrupt_packets = 4
    attempt = feed.start(1, session, 1.0, asyncio.get_running_loop())
    result = await _ended(attempt)
    assert result is not None and result.startswith(expected) and "hunter2" not in result
    assert (attempt.permanent, session.closed, feed.corrupt_packets) == (permanent, True, 4)
    assert ("reader crashed" in caplog.messages) is isinstance(error, RuntimeError)
    feed.finished(attempt)
    assert feed.current is None and feed.corrupt_packets == 4
