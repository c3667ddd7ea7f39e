"""What a stream's media source looks like to the graph.

A source is asyncio-facing: `run(outputs)` produces until the source ends or `stop()` is called,
reporting every state change through `outputs.status` (on the event loop thread) and returning
the final state. Frames and audio go to `outputs.video` / `outputs.audio`, whose `put` may be
called from any thread, so thread-driven decoders (PyAV, GStreamer) and asyncio-native ones
(WebRTC tracks) plug in alike. A `put` returning False means nobody wants more: stop producing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engines.media.remux import EncodedPacket
from pipelines.frames import AudioChunk, StatusChange, StreamState, VideoFrame
from pipelines.graph.counters import Counters


class FrameInput(Protocol):
    def put(self, frame: VideoFrame, timeout: float | None = None) -> bool: ...

    def close(self) -> None: ...


class AudioInput(Protocol):
    def put(self, chunk: AudioChunk) -> bool: ...

    def close(self) -> None: ...


class PacketInput(Protocol):
    """Where a source that demuxes puts each encoded video packet as it came, with its media time
    in the frames' timeline (pts seconds); from any thread, and it must be quick."""

    def put(self, t: float, packet: EncodedPacket) -> None: ...


@dataclass(frozen=True, slots=True)
class SourceOutputs:
    video: FrameInput
    audio: AudioInput | None  # None: the stream's audio is not wanted
    status: Callable[[StatusChange], None]
    packets: PacketInput | None = None  # a stage keeps encoded packets (clips); sources that demux fill it


class MediaSource(Protocol):
    @property
    def display(self) -> str:
        """How the source may be shown in events and logs (never with a secret in it)."""
        ...

    @property
    def lossless(self) -> bool:
        """True when every frame must be processed (a file played as fast as possible): the
        primary frame consumer then holds the source back instead of dropping frames."""
        ...

    @property
    def demuxes(self) -> bool:
        """True when the source puts its own encoded video packets into `SourceOutputs.packets`
        (a PyAV reader); False when it hands decoded frames only (a browser session, GStreamer)."""
        ...

    async def run(self, outputs: SourceOutputs) -> StreamState: ...

    def stop(self) -> None:
        """Ask run() to end soon (STOPPED). Safe from any thread, before or during run()."""
        ...

    def counters(self) -> Counters: ...
