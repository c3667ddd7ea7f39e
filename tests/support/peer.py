"""A browser stand-in made of a real aiortc peer: it sends vtest frames and spoken audio to the
service's `/api/webrtc/offer`, the way the page does (non-trickle, a DataChannel named
"events" created before the offer), and collects what the service sends back."""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

VIDEO_CLOCK = 90_000
AUDIO_RATE = 48_000
AUDIO_PTIME = 0.020


def load_frames(
    path: Path, *, start: int = 100, count: int = 40, size: tuple[int, int] = (640, 480)
) -> list[np.ndarray]:
    """`count` RGB frames of a clip from frame `start` on, scaled to `size` (decoded once, then looped)."""
    frames: list[np.ndarray] = []
    with av.open(str(path)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index >= start:
                frames.append(frame.to_ndarray(format="rgb24", width=size[0], height=size[1]))
            if len(frames) >= count:
                break
    return frames


def load_speech(path: Path, seconds: float = 12.0) -> np.ndarray:
    """Mono s16 samples at 48 kHz (what a browser's Opus track decodes to)."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_RATE)
    chunks: list[np.ndarray] = []
    with av.open(str(path)) as container:
        for frame in container.decode(audio=0):
            chunks += [out.to_ndarray().reshape(-1) for out in resampler.resample(frame)]
            if sum(len(c) for c in chunks) >= seconds * AUDIO_RATE:
                break
    return np.concatenate(chunks)[: int(seconds * AUDIO_RATE)]


class _PacedVideoTrack(MediaStreamTrack):
    """A video track paced by the wall clock like a camera: its n-th item goes out n / fps after
    the first, stamped on the 90 kHz video clock."""

    kind = "video"

    def __init__(self, fps: float) -> None:
        super().__init__()
        self._fps = fps
        self._start: float | None = None
        self.sent = 0

    async def _turn(self) -> tuple[int, int]:
        """(how many went before this item, its pts), once the item is due."""
        if self.readyState != "live":
            raise MediaStreamError  # stopped: the sender stops sending
        if self._start is None:
            self._start = time.monotonic()
        due = self._start + self.sent / self._fps
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        index = self.sent
        self.sent += 1
        return index, int(index * VIDEO_CLOCK / self._fps)


class LoopVideoTrack(_PacedVideoTrack):
    """Frames in a loop at `fps`, encoded by aiortc as it sends them."""

    def __init__(self, frames: list[np.ndarray], fps: float) -> None:
        super().__init__(fps)
        self._frames = frames

    async def recv(self) -> av.VideoFrame:
        index, pts = await self._turn()
        frame = av.VideoFrame.from_ndarray(self._frames[index % len(self._frames)], format="rgb24")
        frame.pts = pts
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        return frame


VP8_BITRATE = 500_000  # the rate aiortc's own VP8 encoder starts a call at
VP8_KEYFRAME_S = 2.0


def encode_vp8(frames: list[np.ndarray], fps: float) -> list[bytes]:
    """The frames encoded once as VP8 (constant bit rate, real-time settings, a keyframe first and
    every VP8_KEYFRAME_S): what a browser's encoder sends, made before the run so the peer costs
    the machine no encoding while it streams."""
    height, width = frames[0].shape[:2]
    codec = av.CodecContext.create("libvpx", "w")
    codec.width, codec.height, codec.pix_fmt = width, height, "yuv420p"
    codec.time_base = fractions.Fraction(1, round(fps))
    codec.framerate = fractions.Fraction(round(fps), 1)
    codec.bit_rate = VP8_BITRATE
    codec.gop_size = max(1, round(fps * VP8_KEYFRAME_S))
    rate = str(VP8_BITRATE)
    codec.options = {"deadline": "realtime", "cpu-used": "-6", "lag-in-frames": "0",
                     "minrate": rate, "maxrate": rate, "bufsize": rate}
    packets: list[av.Packet] = []
    for index, image in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        frame.pts = index
        packets += codec.encode(frame)
    packets += codec.encode(None)
    if not packets or not packets[0].is_keyframe:
        raise RuntimeError("VP8 encoding gave no keyframe first")
    return [bytes(packet) for packet in packets]


class EncodedLoopVideoTrack(_PacedVideoTrack):
    """Pre-encoded VP8 frames (encode_vp8) in a loop at `fps`, paced like LoopVideoTrack. aiortc
    packetizes them as they are, so the peer spends no CPU encoding: a browser encodes on its own
    machine, not on the service's. The loop starts again on the first frame, a keyframe; a
    keyframe the receiver asks for (PLI) comes with the next one scheduled."""

    def __init__(self, payloads: list[bytes], fps: float) -> None:
        super().__init__(fps)
        self._payloads = payloads

    async def recv(self) -> av.Packet:  # type: ignore[override]
        index, pts = await self._turn()
        packet = av.Packet(self._payloads[index % len(self._payloads)])
        packet.pts = pts
        packet.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        return packet


def send_vp8_only(pc: RTCPeerConnection, track: MediaStreamTrack) -> None:
    """Offer only VP8 (and its retransmissions) for `track`: its packets are VP8 already."""
    transceiver = next(t for t in pc.getTransceivers() if t.sender.track is track)
    codecs = RTCRtpSender.getCapabilities("video").codecs
    transceiver.setCodecPreferences([c for c in codecs if c.mimeType.lower() in ("video/vp8", "video/rtx")])


def audio_frame(samples: np.ndarray, pts: int, rate: int) -> av.AudioFrame:
    """A mono s16 frame of `samples` at sample `pts` (time base 1/rate), as a track sends it."""
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = rate
    frame.pts = pts
    frame.time_base = fractions.Fraction(1, rate)
    return frame


class LoopAudioTrack(MediaStreamTrack):
    """Speech in a loop, 20 ms frames of 48 kHz mono s16, paced by the wall clock."""

    kind = "audio"

    def __init__(self, samples: np.ndarray) -> None:
        super().__init__()
        self._samples = samples
        self._start: float | None = None
        self._sent = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        due = self._start + self._sent * AUDIO_PTIME
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        size = int(AUDIO_RATE * AUDIO_PTIME)
        begin = (self._sent * size) % max(1, len(self._samples) - size)
        chunk = self._samples[begin : begin + size]
        self._sent += 1
        return audio_frame(chunk, (self._sent - 1) * size, AUDIO_RATE)


@dataclass
class Peer:
    pc: RTCPeerConnection
    channel: Any
    answer: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    video: LoopVideoTrack | None = None

    @property
    def stream_id(self) -> str:
        return str(self.answer["stream_id"])

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("kind") == kind]

    async def wait_for(self, condition: Callable[[], bool], within_s: float, what: str) -> None:
        deadline = time.monotonic() + within_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; {len(self.messages)} messages")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self.pc.close()


async def make_offer(
    *, frames: list[np.ndarray] | None, speech: np.ndarray | None, fps: float = 15.0
) -> tuple[RTCPeerConnection, Any, LoopVideoTrack | None]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    channel = pc.createDataChannel("events")
    video = LoopVideoTrack(frames, fps) if frames is not None else None
    if video is not None:
        pc.addTrack(video)
    if speech is not None:
        pc.addTrack(LoopAudioTrack(speech))
    await pc.setLocalDescription(await pc.createOffer())  # gathers every candidate (non-trickle)
    return pc, channel, video


async def connect(
    http: aiohttp.ClientSession,
    base_url: str,
    *,
    frames: list[np.ndarray] | None,
    speech: np.ndarray | None = None,
    fps: float = 15.0,
    stream_id: str | None = None,
    token: str | None = None,
    own: dict[str, Any] | None = None,
) -> Peer:
    """Offer, answer, and a collecting DataChannel; raises AssertionError when the offer is refused.
    `own`: the stream's own settings the offer carries (`{"captions": {"language": "es"}}`)."""
    pc, channel, video = await make_offer(frames=frames, speech=speech, fps=fps)
    peer = Peer(pc, channel, video=video)
    channel.on("message", lambda text: peer.messages.append(json.loads(text)))
    body: dict[str, Any] = {**(own or {}), "sdp": pc.localDescription.sdp, "type": "offer"}
    if stream_id is not None:
        body["stream_id"] = stream_id
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.post(f"{base_url}/api/webrtc/offer", json=body, headers=headers) as response:
        answer = await response.json()
        if response.status != 201:
            await pc.close()
            raise AssertionError(f"offer refused: {response.status} {answer}")
    peer.answer = answer
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
    return peer
