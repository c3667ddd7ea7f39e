"""Bounded hand-offs from reader threads to asyncio consumers.

`FrameMailbox` holds at most one video frame. Live sources use it latest-frame-wins: a
newer frame replaces an unconsumed one and the replaced frame is counted as dropped, so
lag never builds up behind a slow detector. Files played "as fast as possible" use it in
blocking mode instead: the reader waits for the consumer, so no frame is lost.

`AudioBuffer` keeps a bounded number of seconds of audio; past the bound the oldest chunk
is dropped and counted.

Producers call from any thread; consumers await from the event loop that created them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from dataclasses import dataclass

from pipelines.errors import PipelineError
from pipelines.frames import AudioChunk, VideoFrame


class MailboxClosed(PipelineError):
    pass


def _wake(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    # A closed loop means nobody is waiting any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(event.set)


@dataclass(slots=True)
class MailboxStats:
    put: int = 0
    taken: int = 0
    dropped: int = 0  # replaced before the consumer took them


class FrameMailbox:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, *, blocking: bool = False) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._blocking = blocking
        self._lock = threading.Condition()
        self._frame: VideoFrame | None = None
        self._closed = False
        self._ready = asyncio.Event()
        self.stats = MailboxStats()

    @property
    def blocking(self) -> bool:
        return self._blocking

    def put(self, frame: VideoFrame, timeout: float | None = None) -> bool:
        """Offer a frame. Returns False when the mailbox is closed (the producer should stop).

        Blocking mode waits (up to `timeout`) until the previous frame was taken; on timeout
        the frame replaces the old one like in lossy mode, so a stuck consumer cannot
        wedge a reader thread forever.
        """
        with self._lock:
            if self._closed:
                return False
            if self._blocking and self._frame is not None:
                self._lock.wait_for(lambda: self._frame is None or self._closed, timeout)
                if self._closed:
                    return False
            if self._frame is not None:
                self.stats.dropped += 1
            self._frame = frame
            self.stats.put += 1
        _wake(self._loop, self._ready)
        return True

    def take_nowait(self) -> VideoFrame | None:
        with self._lock:
            frame, self._frame = self._frame, None
            if frame is not None:
                self.stats.taken += 1
                self._lock.notify_all()
            return frame

    async def get(self) -> VideoFrame:
        """Wait for the newest frame. Raises MailboxClosed once closed and empty."""
        while True:
            frame = self.take_nowait()
            if frame is not None:
                return frame
            with self._lock:
                if self._closed:
                    raise MailboxClosed
                self._ready.clear()
            await self._ready.wait()

    def pending(self) -> int:
        with self._lock:
            return 0 if self._frame is None else 1

    def close(self) -> None:
        """Stop accepting frames; a frame already inside can still be taken."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        _wake(self._loop, self._ready)

    @property
    def closed(self) -> bool:
        return self._closed


@dataclass(slots=True)
class AudioStats:
    chunks_in: int = 0
    seconds_in: float = 0.0
    chunks_dropped: int = 0
    seconds_dropped: float = 0.0


class AudioBuffer:
    """Bounded FIFO of audio chunks (by duration). Oldest chunks go first when full."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, *, max_seconds: float = 10.0) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._max_seconds = max_seconds
        self._chunks: deque[AudioChunk] = deque()
        self._seconds = 0.0
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._closed = False
        self.stats = AudioStats()

    def put(self, chunk: AudioChunk) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._chunks.append(chunk)
            self._seconds += chunk.duration
            self.stats.chunks_in += 1
            self.stats.seconds_in += chunk.duration
            while self._seconds > self._max_seconds and len(self._chunks) > 1:
                old = self._chunks.popleft()
                self._seconds -= old.duration
                self.stats.chunks_dropped += 1
                self.stats.seconds_dropped += old.duration
        _wake(self._loop, self._ready)
        return True

    def drain_nowait(self) -> list[AudioChunk]:
        with self._lock:
            chunks = list(self._chunks)
            self._chunks.clear()
            self._seconds = 0.0
            return chunks

    async def get_many(self) -> list[AudioChunk]:
        """Wait for at least one chunk and return everything buffered. Raises MailboxClosed."""
        while True:
            chunks = self.drain_nowait()
            if chunks:
                return chunks
            with self._lock:
                if self._closed:
                    raise MailboxClosed
                self._ready.clear()
            await self._ready.wait()

    @property
    def buffered_seconds(self) -> float:
        with self._lock:
            return self._seconds

    def close(self) -> None:
        with self._lock:
            self._closed = True
        _wake(self._loop, self._ready)
