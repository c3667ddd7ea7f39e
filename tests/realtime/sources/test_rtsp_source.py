"""RTSP through the supervisor against a real server that we kill, freeze and restart."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest

from pipelines.frames import AudioChunk, StreamState
from pipelines.mailbox import AudioBuffer, FrameMailbox
from realtime.sources import CameraSupervisor, SupervisorPolicy, parse_source
from tests.realtime.sources.util import (
    FAST_POLICY,
    STEADY_POLICY,
    FrameLog,
    StatusLog,
    drain_audio,
    drain_frames,
    eventually,
    strictly_increasing,
)
from tests.support.rtsp import RtspServer

S = StreamState


class Running:
    """A supervisor running in a task with consumers draining its outputs."""

    def __init__(
        self,
        url: str,
        backend: str,
        stream_id: str = "cam",
        policy: SupervisorPolicy = STEADY_POLICY,
        *,
        blocking: bool = False,
    ) -> None:
        self.mailbox = FrameMailbox(blocking=blocking)
        self.audio = AudioBuffer(max_seconds=30.0)
        self.status = StatusLog()
        self.frames = FrameLog()
        self.chunks: list[AudioChunk] = []
        self.supervisor = CameraSupervisor(
            stream_id,
            parse_source(url),
            video=self.mailbox,
            audio=self.audio,
            on_status=self.status,
            backend=backend,
            policy=policy,
        )
        self._tasks: list[asyncio.Task[object]] = []

    async def __aenter__(self) -> Running:
        self._tasks = [
            asyncio.create_task(self.supervisor.run()),
            asyncio.create_task(drain_frames(self.mailbox, self.frames)),
            asyncio.create_task(drain_audio(self.audio, self.chunks)),
        ]
        return self

    async def __aexit__(self, *_: object) -> None:
        self.supervisor.stop()
        state = await asyncio.wait_for(self._tasks[0], timeout=10)
        await asyncio.wait_for(asyncio.gather(*self._tasks[1:]), timeout=5)
        assert state is S.STOPPED


def _pattern(states: list[StreamState]) -> str:
    return " ".join(state.value for state in states)


async def test_clip_over_rtsp_goes_live_with_audio(backend: str, rtsp_server: RtspServer) -> None:
    # A blocking mailbox: the first frame is the session's first, not whichever a slow drain kept.
    async with Running(rtsp_server.url("/vtest"), backend, blocking=True) as run:
        await run.status.wait_for(S.LIVE, within=20)
        await eventually(lambda: len(run.frames.seqs) >= 20 and sum(c.duration for c in run.chunks) >= 1.0, within=20)
    assert run.status.states[:2] == [S.CONNECTING, S.LIVE]
    assert run.frames.shapes == {(576, 768, 3)}
    # A live camera's frames reach the pipeline unconverted (PyAV): only those looked at are.
    assert run.frames.deferred == (len(run.frames.seqs) if backend == "pyav" else 0)
    assert strictly_increasing(run.frames.seqs) and strictly_increasing(run.frames.pts)
    assert run.frames.seqs[0] == 0
    assert run.frames.pts[0] < 1.0  # network timestamps are rebased to the session start
    assert {c.sample_rate for c in run.chunks} == {16_000}


async def test_server_killed_and_restarted_comes_back_live(backend: str, rtsp_server: RtspServer) -> None:
    async with Running(rtsp_server.url("/test"), backend) as run:
        await run.status.wait_for(S.LIVE, within=20)
        await asyncio.sleep(0.5)
        seq_before = run.frames.seqs[-1]
        rtsp_server.kill()
        first_reconnect = await run.status.wait_for(S.RECONNECTING, within=40)  # a failure bound only
        await run.status.wait_for(S.CONNECTING, after=first_reconnect, within=10)
        rtsp_server.restart()
        live_again = await run.status.wait_for(S.LIVE, after=first_reconnect, within=30)
        await asyncio.sleep(0.5)

    states = run.status.states
    assert re.fullmatch(
        r"connecting live reconnecting( connecting reconnecting)* connecting live stopped", _pattern(states)
    ), states
    assert all(event.previous is prev for event, prev in zip(run.status.events[1:], states, strict=False))
    reconnects = [e for e in run.status.events if e.state is S.RECONNECTING]
    assert reconnects[0].retry_in == pytest.approx(STEADY_POLICY.backoff_initial)  # backoff reset after live
    assert all(e.reason for e in reconnects)
    assert run.status.events[live_again].attempt >= 1
    # One sequence for the stream: frames after the reconnect continue the numbering.
    assert strictly_increasing(run.frames.seqs) and run.frames.seqs[-1] > seq_before
    assert run.supervisor.stats.reconnects == len(reconnects)
    assert run.supervisor.stats.connects >= 2


async def test_frozen_server_stalls_then_recovers(backend: str, rtsp_server: RtspServer) -> None:
    """SIGSTOP: the connection stays open and nothing arrives. The watchdog reports STALLED;
    SIGCONT brings frames (and LIVE) back on the same connection; a longer freeze makes the
    supervisor give up on the session and reconnect (before the reader's own read timeout).
    Each in its own supervisor: the first with a restart far off, so that frames resuming late
    on a loaded machine are still a resume, not a reconnect."""
    patient = dataclasses.replace(FAST_POLICY, stall_restart_s=60.0)
    async with Running(rtsp_server.url("/test"), backend, policy=patient) as run:
        await run.status.wait_for(S.LIVE, within=20)
        paused = len(run.status.events)
        rtsp_server.pause()
        try:
            stalled = await run.status.wait_for(S.STALLED, after=paused, within=15)
        finally:
            rtsp_server.resume()
        resumed = await run.status.wait_for(S.LIVE, after=stalled, within=30)
        assert run.status.since(stalled) == [S.STALLED, S.LIVE]
        assert run.status.events[resumed].reason == "frames resumed"
    assert run.supervisor.stats.stalls == 1 and run.supervisor.stats.reconnects == 0
    assert strictly_increasing(run.frames.seqs)

    policy = dataclasses.replace(FAST_POLICY, read_timeout_s=10.0)
    async with Running(rtsp_server.url("/test"), backend, policy=policy) as run:
        await run.status.wait_for(S.LIVE, within=20)
        paused = len(run.status.events)
        rtsp_server.pause()
        try:
            stalled = await run.status.wait_for(S.STALLED, after=paused, within=15)
            restarting = await run.status.wait_for(S.RECONNECTING, after=stalled, within=20)
        finally:
            rtsp_server.resume()
        assert run.status.since(stalled)[:2] == [S.STALLED, S.RECONNECTING]
        assert "stalled for" in (run.status.events[restarting].reason or "")
        await run.status.wait_for(S.LIVE, after=restarting, within=30)
    assert run.supervisor.stats.stalls == 1
    assert strictly_increasing(run.frames.seqs)


async def test_a_camera_once_live_is_never_given_up(rtsp_server: RtspServer) -> None:
    """`max_failed_connects` (`run --connect-attempts`) is for a source never reached: once it has
    been live, a dead server is retried for ever, however many connects fail in a row."""
    policy = dataclasses.replace(FAST_POLICY, max_failed_connects=1)
    async with Running(rtsp_server.url("/test"), "pyav", policy=policy) as run:
        await run.status.wait_for(S.LIVE, within=20)
        rtsp_server.kill()
        down = await run.status.wait_for(S.RECONNECTING, within=20)
        attempts = run.supervisor.stats.connect_attempts
        await eventually(lambda: run.supervisor.stats.connect_attempts >= attempts + 3, within=30)
        assert S.FAILED not in run.status.states
        rtsp_server.restart()
        await run.status.wait_for(S.LIVE, after=down, within=30)
    assert S.FAILED not in run.status.states


async def test_a_frozen_camera_is_stalled_first_and_named(backend: str, rtsp_server: RtspServer) -> None:
    """SIGSTOP with the read timeout equal to the watchdog, as by default (5 s and 5 s). Both
    backends report `stalled` first, naming the camera, then the supervisor reconnects; the
    reader's own timeout never beats the watchdog (PyAV's used to hand out one buffered frame
    just as the watchdog was due, then reconnect with "Invalid data found ...")."""
    policy = dataclasses.replace(FAST_POLICY, read_timeout_s=FAST_POLICY.watchdog_s)
    async with Running(rtsp_server.url("/test"), backend, policy=policy) as run:
        live = await run.status.wait_for(S.LIVE, within=20)
        rtsp_server.pause()
        try:
            restarting = await run.status.wait_for(S.RECONNECTING, after=live, within=30)
        finally:
            rtsp_server.resume()
        events = run.status.events[live : restarting + 1]
    assert [e.state for e in events] == [S.LIVE, S.STALLED, S.RECONNECTING], [(e.state, e.reason) for e in events]
    assert re.fullmatch(rf"no video from 127\.0\.0\.1:{rtsp_server.port} for \d+\.\d s", events[1].reason or "")
    assert (events[2].reason or "").startswith("stalled for ")
    assert run.supervisor.stats.stalls == 1
