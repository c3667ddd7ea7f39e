"""One browser session: its peer connection, as the media source of a `webrtc` stream.

The session ends on whichever comes first: the connection going `failed` or `closed`, the
page's DataChannel closing, the page sending a DataChannel message over the bound (sctp.py), a
`pagehide` beacon with the session's close token, a DELETE of the stream, no media for
`webrtc.inactivity_timeout_s` (a closed tab leaves the connection up, but its media stops), no
connection within `webrtc.connect_timeout_s`, or shutdown. Ending closes the peer connection,
which ends its tracks and stops aiortc's decoder threads; the reader tasks are children of
`run()` and are cancelled before it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import Any

from aiortc import RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack

from pipelines.frames import StatusChange, StreamState
from pipelines.graph import SourceOutputs, counter, register_counters
from pipelines.graph.counters import Counters, frame_stage, queue_depth
from pipelines.tasks import TaskOwner
from realtime.config import WebRtcSettings
from realtime.streams.fanout import Listener
from realtime.webrtc.channel import EventChannel
from realtime.webrtc.media import MediaStats, SessionClock, VideoLimits, drain, read_audio, read_video

log = logging.getLogger(__name__)

# fanout.listen: registers a listener of one stream's events for the duration of a block.
ListenTo = Callable[[str, Listener], contextlib.AbstractContextManager[None]]

register_counters(
    {
        "frames_in": frame_stage("in"),
        "webrtc_video_stale": counter("Browser video frames skipped unconverted: a newer one was queued"),
        "webrtc_video_over_rate": counter("Browser video frames skipped unconverted: faster than webrtc.max_fps"),
        "webrtc_video_scaled": counter("Browser video frames scaled down to webrtc.max_width x max_height"),
        "webrtc_audio_frames": counter("Browser audio frames received"),
        "webrtc_audio_discarded": counter("Browser audio frames discarded: the stream wants no audio"),
        "webrtc_extra_frames": counter("Frames of extra browser tracks (beyond one video, one audio), discarded"),
        "channel_sent": counter("Events sent to the browser over its DataChannel"),
        "channel_dropped": counter("Events not sent to the browser: stale detections, overflow"),
        "channel_lost": counter("Alerts or captions dropped because the page never opened its DataChannel"),
        "channel_queue_depth": queue_depth("channel"),
    },
    section="browser",
)


class WebRtcSession:
    def __init__(
        self,
        stream_id: str,
        pc: RTCPeerConnection,
        *,
        settings: WebRtcSettings,
        listen: ListenTo,
        on_end: Callable[[WebRtcSession], None],
        on_connected: Callable[[WebRtcSession], None] | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.pc = pc
        self.settings = settings
        self.close_token = secrets.token_urlsafe(24)
        # The WHIP resource (`/whip/{stream}/{resource_id}`) and its entity tag: both unguessable,
        # so knowing a stream's id is not enough to end or trickle into its session.
        self.resource_id = secrets.token_urlsafe(16)
        self.etag = f'"{secrets.token_hex(8)}"'
        self.remote_ice: tuple[str | None, str | None] = (None, None)  # the offer's ice-ufrag, ice-pwd
        self.candidates = 0  # remote candidates taken, from the offer and trickled (webrtc.max_ice_candidates)
        self.channel = EventChannel(max_buffered_bytes=settings.channel_buffer_bytes, on_stuck=self.close)
        self.stats = MediaStats()
        self.clock = SessionClock()
        self.tracks: list[MediaStreamTrack] = []
        self.end_reason: str | None = None
        self.connected_once = False
        self.running = False
        self._listen = listen
        self._on_end = on_end
        self._on_connected = on_connected
        self._ended = asyncio.Event()
        self._connected = asyncio.Event()
        self._peer_closed: asyncio.Task[None] | None = None
        self._closing = TaskOwner(f"{stream_id} browser session")  # the one close every caller awaits
        self._started = time.monotonic()
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)

    # -- MediaSource ---------------------------------------------------------------------------

    @property
    def display(self) -> str:
        return "browser session"

    @property
    def lossless(self) -> bool:
        return False

    @property
    def demuxes(self) -> bool:
        return False  # aiortc decodes the browser's RTP itself

    @property
    def kinds(self) -> set[str]:
        return {track.kind for track in self.tracks}

    async def run(self, outputs: SourceOutputs) -> StreamState:
        self.running = True
        state = StreamState.CONNECTING
        outputs.status(StatusChange(self.stream_id, state, None, time.time()))
        try:
            with self._listen(self.stream_id, self.channel.offer):
                async with asyncio.TaskGroup() as group:
                    tasks = [
                        group.create_task(self.channel.run(), name=f"{self.stream_id}-channel"),
                        group.create_task(self._watch(outputs), name=f"{self.stream_id}-watch"),
                    ]
                    tasks += [group.create_task(reader) for reader in self._readers(outputs)]
                    await self._ended.wait()
                    for task in tasks:
                        task.cancel()
        finally:
            self.close("internal error")  # a no-op unless a reader failed or the run was cancelled
            await self.close_peer()
        final = StreamState.STOPPED if self.connected_once else StreamState.FAILED
        previous = StreamState.LIVE if self.connected_once else StreamState.CONNECTING
        outputs.status(StatusChange(self.stream_id, final, previous, time.time(), reason=self.end_reason))
        log.info(
            "webrtc session ended",
            extra={
                "stream_id": self.stream_id,
                "reason": self.end_reason,
                "duration_s": round(time.monotonic() - self._started, 1),
                "frames_in": self.stats.frames_in,
            },
        )
        return final

    def stop(self) -> None:
        self.close("stopped")

    def counters(self) -> Counters:
        stats, channel = self.stats, self.channel.stats
        return {
            "frames_in": stats.frames_in,
            "webrtc_video_stale": stats.video_stale,
            "webrtc_video_over_rate": stats.video_over_rate,
            "webrtc_video_scaled": stats.video_scaled,
            "webrtc_audio_frames": stats.audio_frames,
            "webrtc_audio_discarded": stats.audio_discarded,
            "webrtc_extra_frames": stats.extra_frames,
            "channel_sent": channel.sent,
            "channel_dropped": channel.dropped,
            "channel_lost": channel.lost,
            "channel_queue_depth": self.channel.depth,
        }

    # -- ending ---------------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """End the session (idempotent, from the event loop); the first reason is kept."""
        if self._ended.is_set():
            return
        self.end_reason = reason
        self._ended.set()
        log.info("webrtc session ending", extra={"stream_id": self.stream_id, "reason": reason})
        self._on_end(self)

    def close_peer(self) -> asyncio.Task[None]:
        """Close the peer connection (once; every caller awaits the same close)."""
        if self._peer_closed is None:
            self._peer_closed = self._closing.spawn(self.pc.close(), f"{self.stream_id}-pc-close", awaited=True)
        return self._peer_closed

    # -- inside run ----------------------------------------------------------------------------

    def _readers(self, outputs: SourceOutputs) -> list[Coroutine[Any, Any, None]]:
        settings = self.settings
        limits = VideoLimits(settings.max_width, settings.max_height, settings.max_fps)
        readers: list[Coroutine[Any, Any, None]] = []
        seen: set[str] = set()
        for track in self.tracks:
            if track.kind in seen:
                readers.append(drain(track, self.stats))
            elif track.kind == "video":
                readers.append(
                    read_video(
                        track,
                        outputs.video,
                        stream_id=self.stream_id,
                        limits=limits,
                        clock=self.clock,
                        stats=self.stats,
                    )
                )
            else:
                readers.append(
                    read_audio(track, outputs.audio, stream_id=self.stream_id, clock=self.clock, stats=self.stats)
                )
            seen.add(track.kind)
        return readers

    async def _watch(self, outputs: SourceOutputs) -> None:
        settings = self.settings
        try:
            async with asyncio.timeout(settings.connect_timeout_s):
                await self._connected.wait()
        except TimeoutError:
            self.close(f"not connected within {settings.connect_timeout_s:g} s (webrtc.connect_timeout_s)")
            return
        outputs.status(StatusChange(self.stream_id, StreamState.LIVE, StreamState.CONNECTING, time.time()))
        connected_at = time.monotonic()
        limit = settings.inactivity_timeout_s
        silent_ticks = 0
        while True:
            await asyncio.sleep(min(0.5, limit / 4))
            last = self.stats.last_media_at or connected_at
            if time.monotonic() - last <= limit:
                silent_ticks = 0
                continue
            # Silence must be seen on two ticks in a row: after a stall of the loop itself this timer can
            # run before the media the stall held up is delivered, and that is not the peer's silence.
            silent_ticks += 1
            if silent_ticks >= 2:
                self.close(f"no media for {limit:g} s (webrtc.inactivity_timeout_s)")
                return

    # -- aiortc events ---------------------------------------------------------------------------

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind in ("audio", "video"):
            self.tracks.append(track)

    def _on_datachannel(self, channel: Any) -> None:
        if self.channel.attached:
            return  # the first channel carries the events; others are the page's own business
        self.channel.attach(channel)
        channel.on("close", lambda: self.close("the page closed its data channel"))

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            if not self.connected_once and self._on_connected is not None:
                self._on_connected(self)
            self.connected_once = True
            self._connected.set()
        elif state in ("failed", "closed"):
            self.close(f"the connection is {state}")
