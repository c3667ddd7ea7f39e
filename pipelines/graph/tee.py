"""Tees: one source, several consumers, each with its own bounded input.

`FrameTee.put` offers every frame to each consumer's `FrameMailbox`. The mailboxes are
latest-frame-wins, so a slow consumer only ever misses frames (counted by its mailbox) and never
delays the others or the source. The one exception is the primary consumer of a lossless source
(a file played as fast as possible): its mailbox blocks, so that consumer sees every frame and
paces the reader. Secondary consumers are offered each frame first, so the primary's wait never
holds a frame back from them.

`AudioTee` does the same for audio: every consumer has its own `AudioBuffer`, bounded in
seconds, that drops its oldest audio when its reader falls behind.

`put` may be called from any thread; `attach` is called while the graph is built, before the
source runs. With the stream's clock, `put` stamps each frame with its time on it (`t`) before any
consumer sees it, in the order the source delivers them.
"""

from __future__ import annotations

import asyncio
import dataclasses

from pipelines.clock import StreamClock
from pipelines.frames import AudioChunk, VideoFrame
from pipelines.mailbox import AudioBuffer, FrameMailbox


class FrameTee:
    def __init__(self, *, lossless: bool = False, loop: asyncio.AbstractEventLoop | None = None,
                 clock: StreamClock | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._lossless = lossless
        self._clock = clock
        self._primary: FrameMailbox | None = None
        self._others: list[FrameMailbox] = []
        self._names: dict[str, FrameMailbox] = {}
        self._closed = False

    @property
    def lossless(self) -> bool:
        return self._lossless

    def attach(self, name: str, *, primary: bool = False) -> FrameMailbox:
        if name in self._names:
            raise ValueError(f"frame consumer {name!r} is attached already")
        box = FrameMailbox(self._loop, blocking=primary and self._lossless)
        if self._closed:
            box.close()
        self._names[name] = box
        if primary:
            self._primary = box
        else:
            self._others.append(box)
        return box

    def put(self, frame: VideoFrame, timeout: float | None = None) -> bool:
        """Offer a frame to every consumer. False once no consumer takes frames any more."""
        if self._closed:
            return False
        if self._clock is not None:
            frame = dataclasses.replace(frame, t=self._clock(frame.pts, frame.captured_at))
        accepted = False
        for box in self._others:
            accepted = box.put(frame) or accepted
        if self._primary is not None:
            accepted = self._primary.put(frame, timeout) or accepted
        # A graph without frame consumers (audio only) still lets its source run.
        return accepted or not self._names

    def close(self) -> None:
        self._closed = True
        for box in self._names.values():
            box.close()



class AudioTee:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._buffers: dict[str, AudioBuffer] = {}
        self._closed = False

    @property
    def consumers(self) -> tuple[str, ...]:
        """The names of the consumers attached so far."""
        return tuple(self._buffers)

    def attach(self, name: str, *, max_seconds: float) -> AudioBuffer:
        if name in self._buffers:
            raise ValueError(f"audio consumer {name!r} is attached already")
        buffer = AudioBuffer(self._loop, max_seconds=max_seconds)
        if self._closed:
            buffer.close()
        self._buffers[name] = buffer
        return buffer

    def put(self, chunk: AudioChunk) -> bool:
        if self._closed:
            return False
        accepted = False
        for buffer in self._buffers.values():
            accepted = buffer.put(chunk) or accepted
        return accepted or not self._buffers

    def close(self) -> None:
        self._closed = True
        for buffer in self._buffers.values():
            buffer.close()
