"""Sources that cannot be reached or read: retry, give up, stop, and never leak a secret."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pipelines.frames import StatusChange, StreamState
from pipelines.mailbox import FrameMailbox
from realtime.sources import CameraSupervisor, SupervisorPolicy, gst_source, parse_source
from realtime.sources import supervisor as supervisor_module
from realtime.sources.session import SourceError, VideoSink
from tests.realtime.sources.util import FAST_POLICY, StatusLog, eventually, reader_threads
from tests.support.rtsp import RtspServer

S = StreamState
RETRY_POLICY = dataclasses.replace(FAST_POLICY, backoff_initial=0.1, backoff_max=0.4, open_timeout_s=2.0)


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _supervisor(
    url: str, backend: str, status: StatusLog, policy: SupervisorPolicy, stream_id: str = "cam"
) -> CameraSupervisor:
    return CameraSupervisor(
        stream_id, parse_source(url), video=FrameMailbox(), audio=None, on_status=status, backend=backend, policy=policy
    )


async def test_refused_connection_keeps_retrying_until_stopped(backend: str, closed_port: int) -> None:
    status = StatusLog()
    supervisor = _supervisor(f"rtsp://127.0.0.1:{closed_port}/cam", backend, status, RETRY_POLICY)
    task = asyncio.create_task(supervisor.run())
    while sum(state is S.RECONNECTING for state in status.states) < 5:
        await status.wait_for(S.CONNECTING, after=len(status.events), within=20)
    supervisor.stop()
    assert await asyncio.wait_for(task, timeout=5) is S.STOPPED

    retries = [e for e in status.events if e.state is S.RECONNECTING]
    delays = [e.retry_in for e in retries]
    assert delays[:4] == pytest.approx([0.1, 0.2, 0.4, 0.4])  # exponential, capped
    assert [e.attempt for e in retries[:5]] == [1, 2, 3, 4, 5]
    assert all(str(closed_port) in (e.reason or "") for e in retries)
    assert status.states[-1] is S.STOPPED and S.LIVE not in status.states
    assert supervisor.stats.connects == 0 and supervisor.stats.connect_attempts >= 5


async def test_gives_up_after_max_failed_connects(backend: str, closed_port: int) -> None:
    status = StatusLog()
    policy = dataclasses.replace(RETRY_POLICY, max_failed_connects=1)
    supervisor = _supervisor(f"rtsp://127.0.0.1:{closed_port}/cam", backend, status, policy)
    assert await asyncio.wait_for(supervisor.run(), timeout=20) is S.FAILED
    assert status.states == [S.CONNECTING, S.FAILED]
    reason = status.events[-1].reason or ""
    assert f"127.0.0.1:{closed_port}" in reason and "gave up after 1 failed connect" in reason
    assert "\n" not in reason


async def test_stop_is_prompt_while_a_connect_hangs(backend: str, rtsp_server: RtspServer) -> None:
    """A frozen server accepts TCP but never answers: stop() must not wait for the timeouts."""
    rtsp_server.pause()
    status = StatusLog()
    policy = dataclasses.replace(FAST_POLICY, open_timeout_s=3.0)
    supervisor = _supervisor(rtsp_server.url("/test"), backend, status, policy, stream_id="hung")
    task = asyncio.create_task(supervisor.run())
    await status.wait_for(S.CONNECTING)
    await asyncio.sleep(0.5)  # the reader is now blocked in its connect
    supervisor.stop()
    assert await asyncio.wait_for(task, timeout=3) is S.STOPPED
    assert status.states == [S.CONNECTING, S.STOPPED]
    # A reader that was still blocked is left to finish on its own timeout: it must not linger.
    await eventually(lambda: not reader_threads("hung"), within=20)


async def test_cancel_reports_stopped_and_closes_the_mailbox(closed_port: int) -> None:
    status = StatusLog()
    mailbox = FrameMailbox()
    supervisor = CameraSupervisor(
        "cam",
        parse_source(f"rtsp://127.0.0.1:{closed_port}/x"),
        video=mailbox,
        audio=None,
        on_status=status,
        policy=RETRY_POLICY,
    )
    task = asyncio.create_task(supervisor.run())
    await status.wait_for(S.RECONNECTING)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert status.states[-1] is S.STOPPED and status.events[-1].reason == "cancelled"
    assert mailbox.closed


async def test_password_never_reaches_reasons_or_logs(
    backend: str, rtsp_server: RtspServer, closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "s3cr3t-pw"
    policy = dataclasses.replace(RETRY_POLICY, max_failed_connects=2)
    urls = [
        f"rtsp://admin:{secret}@127.0.0.1:{closed_port}/cam",  # refused
        rtsp_server.url("/no-such-mount", userinfo=f"admin:{secret}"),  # 404 from a real server
    ]
    for url in urls:
        status = StatusLog()
        supervisor = _supervisor(url, backend, status, policy)
        assert await asyncio.wait_for(supervisor.run(), timeout=20) is S.FAILED
        reasons = [e.reason or "" for e in status.events]
        assert all(secret not in reason for reason in reasons)
        assert secret not in (supervisor.stats.last_error or "")
    assert "rtsp://admin:***@127.0.0.1" in reasons[-1]  # the 404 names the (redacted) URL
    for record in caplog.records:
        assert secret not in record.getMessage()
        assert all(secret not in str(value) for value in vars(record).values())


async def test_missing_gstreamer_fails_at_once_and_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    monkeypatch.setattr(gst_source, "_gst", None)
    monkeypatch.setitem(sys.modules, "gi", None)  # import gi -> ImportError
    status = StatusLog()
    supervisor = _supervisor(f"rtsp://127.0.0.1:{closed_port}/cam", "gstreamer", status, RETRY_POLICY)
    assert await asyncio.wait_for(supervisor.run(), timeout=10) is S.FAILED
    assert status.states == [S.CONNECTING, S.FAILED]  # retrying cannot help
    assert "pip install" in (status.events[-1].reason or "")


async def test_a_failing_status_callback_does_not_stop_the_stream(sample_clip: Path) -> None:
    def explode(change: object) -> None:
        raise RuntimeError("subscriber bug")

    mailbox = FrameMailbox()
    supervisor = CameraSupervisor(
        "cam",
        parse_source(str(sample_clip)),
        video=mailbox,
        audio=None,
        on_status=explode,
        policy=FAST_POLICY,
        max_frames=3,
    )
    assert await asyncio.wait_for(supervisor.run(), timeout=20) is S.STOPPED
    assert supervisor.stats.frames == 3


def test_bad_arguments_are_rejected_up_front(sample_clip: Path) -> None:
    spec = parse_source(str(sample_clip))
    with pytest.raises(ValueError, match="pyav, gstreamer"):
        CameraSupervisor("cam", spec, video=None, audio=None, on_status=print, backend="vlc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stream id"):
        CameraSupervisor("bad id!", spec, video=None, audio=None, on_status=print)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="watchdog_s"):
        SupervisorPolicy(watchdog_s=0)
    with pytest.raises(ValueError, match="max_failed_connects"):
        SupervisorPolicy(max_failed_connects=0)


def test_backoff_grows_and_is_capped() -> None:
    policy = SupervisorPolicy(backoff_initial=0.5, backoff_factor=2.0, backoff_max=10.0)
    assert [policy.retry_delay(n) for n in range(7)] == [0.5, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    jittery = dataclasses.replace(policy, backoff_jitter=0.2)
    assert all(0.8 * 8.0 <= jittery.retry_delay(5) <= 8.0 for _ in range(50))


class _FreezesThenTimesOut:
    """A camera that sends three frames, then nothing until the reader's own timeout ends the
    session (signalling `ended` just before it raises); later sessions just wait to be stopped."""

    corrupt_packets = 0

    def __init__(self, silence_s: float | None, ended: threading.Event) -> None:
        self.silence_s = silence_s
        self.ended = ended

    def open(self) -> None:
        pass

    def run(self, video_out: VideoSink, audio_out: object, stop: threading.Event, packets_out: object = None) -> None:
        if self.silence_s is None:
            stop.wait(30)
            return
        for index in range(3):
            video_out(np.zeros((2, 2, 3), np.uint8), index / 10, time.time())
        stop.wait(self.silence_s)
        self.ended.set()
        raise SourceError(f"no data from 127.0.0.1:8554 for {self.silence_s} s")

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


async def test_a_reader_timeout_after_the_stall_restart_was_due_is_the_stall_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The event loop runs late (here: a status callback blocks it from STALLED until the reader
    has given up): the reader's own timeout ends the session after the stall restart was due.
    That is reported as the stall restart, as it would have been on time, not as a read error."""
    policy = dataclasses.replace(FAST_POLICY, watchdog_s=0.2, stall_restart_s=0.3)
    ended = threading.Event()
    sessions = iter([_FreezesThenTimesOut(0.7, ended)])
    monkeypatch.setattr(
        supervisor_module,
        "create_session",
        lambda *_: next(sessions, None) or _FreezesThenTimesOut(None, ended),
    )
    status = StatusLog()

    def late_loop(change: StatusChange) -> None:
        status(change)
        if change.state is S.STALLED:
            assert ended.wait(10)  # a failure bound only

    supervisor = CameraSupervisor(
        "cam", parse_source("rtsp://127.0.0.1:8554/cam"), video=FrameMailbox(), audio=None, on_status=late_loop,
        policy=policy,
    )
    task = asyncio.create_task(supervisor.run())
    try:
        restarting = await status.wait_for(S.RECONNECTING, within=20)
    finally:
        supervisor.stop()
        assert await asyncio.wait_for(task, timeout=10) is S.STOPPED
    assert status.states[: restarting + 1] == [S.CONNECTING, S.LIVE, S.STALLED, S.RECONNECTING]
    assert (status.events[restarting].reason or "").startswith("stalled for "), status.events[restarting]
    assert supervisor.stats.stalls == 1
