"""Helpers for supervisor tests: record status changes, drain mailboxes, small policies."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipelines.frames import AudioChunk, DeferredImage, StatusChange, StreamState
from pipelines.mailbox import AudioBuffer, FrameMailbox, MailboxClosed
from realtime.sources import CameraSupervisor, SupervisorPolicy, parse_source

# Short timings so failures show up fast; deadlines in tests are failure timeouts only.
FAST_POLICY = SupervisorPolicy(
    backoff_initial=0.2,
    backoff_max=1.0,
    backoff_factor=2.0,
    watchdog_s=1.5,
    stall_restart_s=4.0,
    open_timeout_s=3.0,
    read_timeout_s=5.0,
)
# For tests that are not about stalls: FAST_POLICY's 1.5 s watchdog reads a reader starved of CPU
# on a loaded machine as a stalled camera, which such a test's states do not expect.
STEADY_POLICY = dataclasses.replace(FAST_POLICY, watchdog_s=30.0)


class StatusLog:
    """An `on_status` callback that remembers every change and lets tests await one."""

    def __init__(self) -> None:
        self.events: list[StatusChange] = []
        self.threads: set[int] = set()
        self._changed = asyncio.Event()

    def __call__(self, change: StatusChange) -> None:
        self.events.append(change)
        self.threads.add(threading.get_ident())
        self._changed.set()

    @property
    def states(self) -> list[StreamState]:
        return [event.state for event in self.events]

    async def wait_for(self, state: StreamState, *, after: int = 0, within: float = 30.0) -> int:
        """Index of the first `state` event at or after index `after`."""
        try:
            async with asyncio.timeout(within):
                while True:
                    for index in range(after, len(self.events)):
                        if self.events[index].state == state:
                            return index
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            seen = [(e.state.value, e.reason) for e in self.events]
            raise AssertionError(f"no {state.value} after #{after} within {within} s; saw {seen}") from None

    def since(self, index: int) -> list[StreamState]:
        return self.states[index:]


@dataclass
class FrameLog:
    seqs: list[int] = field(default_factory=list)
    pts: list[float] = field(default_factory=list)
    captured_at: list[float] = field(default_factory=list)
    shapes: set[tuple[int, ...]] = field(default_factory=set)
    dtypes: set[str] = field(default_factory=set)
    deferred: int = 0  # frames that arrived unconverted, their size already right


async def drain_frames(mailbox: FrameMailbox, into: FrameLog) -> None:
    """Take frames until the mailbox closes, keeping only their metadata."""
    try:
        while True:
            frame = await mailbox.get()
            into.seqs.append(frame.seq)
            into.pts.append(frame.pts)
            into.captured_at.append(frame.captured_at)
            pixels = frame.pixels
            if isinstance(pixels, DeferredImage) and not pixels.converted:
                into.deferred += pixels.rgb().shape[:2] == (frame.height, frame.width)
            into.shapes.add(frame.image.shape)
            into.dtypes.add(str(frame.image.dtype))
    except MailboxClosed:
        return


async def drain_audio(buffer: AudioBuffer, into: list[AudioChunk]) -> None:
    try:
        while True:
            into.extend(await buffer.get_many())
    except MailboxClosed:
        return


def strictly_increasing(values: Sequence[float]) -> bool:
    return bool(np.all(np.diff(np.asarray(values, dtype=np.float64)) > 0))


def reader_threads(stream_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"source-{stream_id}-")]


async def eventually(predicate: Callable[[], bool], *, within: float) -> None:
    """Poll `predicate` until it holds; AssertionError after `within` seconds."""
    deadline = time.monotonic() + within
    for _ in itertools.count():
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(0.05)


@dataclass
class FilePlay:
    """What `play_file` saw: the end state, the status changes, the supervisor (its stats), the
    frames and audio chunks taken, and the mailbox and audio buffer they came through."""

    state: StreamState
    status: StatusLog
    supervisor: CameraSupervisor
    frames: FrameLog
    chunks: list[AudioChunk]
    mailbox: FrameMailbox
    audio: AudioBuffer | None


async def play_file(
    path: Path, backend: str, *, stream_id: str = "clip", audio: bool = True
) -> FilePlay:
    """Play a file as fast as it goes (a blocking mailbox: nothing dropped) under the supervisor
    (STEADY_POLICY: a reader paused by a loaded machine is no stall here)."""
    mailbox = FrameMailbox(blocking=True)
    buffer = AudioBuffer(max_seconds=120.0) if audio else None
    status = StatusLog()
    supervisor = CameraSupervisor(
        stream_id,
        parse_source(str(path)),
        video=mailbox,
        audio=buffer,
        on_status=status,
        backend=backend,
        policy=STEADY_POLICY,
    )
    frames, chunks = FrameLog(), list[AudioChunk]()
    async with asyncio.TaskGroup() as group:
        group.create_task(drain_frames(mailbox, frames))
        if buffer is not None:
            group.create_task(drain_audio(buffer, chunks))
        state = await asyncio.wait_for(supervisor.run(), timeout=120)  # a failure deadline only
    return FilePlay(state, status, supervisor, frames, chunks, mailbox, buffer)
