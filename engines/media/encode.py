"""Encode decoded frames into packets a clip can be cut from, for sources that hand no packets.

A camera read by PyAV hands its own encoded packets to the clip buffer (remux only). A browser
session arrives already decoded by aiortc, and GStreamer decodes inside its pipeline, so their clips
need the frames encoded again. That costs CPU the detector and the recognizer also want, so the
encoder is made cheap: x264 `ultrafast` with `zerolatency` (no lookahead, no B-frames: a packet
comes out for every frame put in, in presentation order), a constant quality, and keyframes forced
by time (`keyint_s`), not by frame count, so a stream whose frames the caller thins still starts a
group of pictures every `keyint_s` and the buffer trims by time as it does for a camera.

Each encoder (a new one on every change of frame size) makes its own `CodecHeader`, so its packets
are written into an MP4 exactly like a camera's (engines.media.remux). x264 writes Annex B (start
codes) while the header's Matroska file keeps the parameters as avcC, which MP4 and Matroska
readers take to mean length-prefixed NAL units: the packets are kept in that form.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from engines.media.remux import CodecHeader, EncodedPacket

TIME_BASE = Fraction(1, 90_000)  # the RTP video clock: fine enough for any frame rate
RESTART_S = 0.5  # pts this far back is the source's clock starting again (a reconnect), not jitter


@dataclass(frozen=True, slots=True)
class EncoderSettings:
    keyint_s: float = 2.0  # a keyframe at least this often (a clip starts at one)
    crf: int = 28  # constant quality: surveillance evidence, not a film
    preset: str = "ultrafast"
    # x264's profile (None: what the preset gives). Live viewers ask for "baseline", which x264
    # writes as Constrained Baseline: the one profile every browser's WebRTC decoder takes.
    profile: str | None = None
    # Wider frames are scaled down to this width (aspect kept, both sides made even) inside the
    # encoder's own colour conversion; None keeps the frame's size (odd sizes are refused).
    max_width: int | None = None


class FrameEncoder:
    """Frames (RGB, with their pts in seconds) in, H.264 packets out; not thread-safe: one caller."""

    def __init__(self, settings: EncoderSettings | None = None) -> None:
        self.settings = settings or EncoderSettings()
        self.frames = 0
        self.keyframes = 0
        self._out: Any = None  # an in-memory container that only holds the encoder's stream
        self._stream: Any = None
        self._size: tuple[int, int] | None = None
        self._header: CodecHeader | None = None
        self._last_key: float | None = None
        self._last_pts: int | None = None

    @property
    def running(self) -> bool:
        """An x264 context is open (from the first frame after a close until the next close)."""
        return self._out is not None

    @property
    def encoded_size(self) -> tuple[int, int] | None:
        """The size the frames are encoded at (after max_width), while running."""
        return None if self._stream is None else (int(self._stream.width), int(self._stream.height))

    def keyframe_next(self) -> None:
        """Make the next frame a keyframe (a new viewer starts decoding there). Only sets a flag:
        safe from another thread than the one encoding."""
        self._last_key = None

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """The size a `width` x `height` frame is encoded at."""
        cap = self.settings.max_width
        if cap is None:
            return width, height
        if width > cap:
            height, width = max(1, round(height * cap / width)), cap
        return max(2, width - width % 2), max(2, height - height % 2)

    def encode(self, image: np.ndarray, pts_s: float) -> list[EncodedPacket]:
        """Encode one frame; its packets (one, with zerolatency), the first of each encoder a
        keyframe. A frame whose pts does not advance is dropped (MP4 needs increasing times),
        unless its pts went back by RESTART_S or more: the source reconnected and its clock starts
        again, so a new encoder (a new header) starts, as a camera's reconnect does."""
        import av

        height, width = image.shape[:2]
        pts = round(pts_s / TIME_BASE)
        restarted = self._last_pts is not None and pts_s <= float(self._last_pts * TIME_BASE) - RESTART_S
        if self._size != (width, height) or restarted:
            self._open(width, height)
        if self._last_pts is not None and pts <= self._last_pts:
            return []
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        frame.pts = pts
        frame.time_base = TIME_BASE
        if self._last_key is None or pts_s - self._last_key >= self.settings.keyint_s:
            frame.pict_type = av.video.frame.PictureType.I
            self._last_key = pts_s
        self._last_pts = pts
        self.frames += 1
        return self._packets(self._stream.encode(frame))

    def close(self) -> None:
        if self._out is not None:
            with contextlib.suppress(Exception):  # a half-opened encoder has nothing to give back
                self._stream.encode(None)  # drain: with zerolatency nothing is held back
            self._out = self._stream = self._header = None
            self._size = None

    def _open(self, width: int, height: int) -> None:
        import av

        self.close()
        size = (width, height)  # the source's size: a change of it opens a new encoder
        # x264 needs even dimensions for 4:2:0; a browser can send odd ones.
        if self.settings.max_width is None and (width % 2 or height % 2):
            raise ValueError(f"frame size {width}x{height}: H.264 4:2:0 needs even dimensions")
        out = av.open(io.BytesIO(), "w", format="matroska")
        stream = out.add_stream("libx264", rate=30)
        # PyAV converts each frame to the encoder's size and format in one swscale pass.
        width, height = self.target_size(width, height)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = TIME_BASE
        stream.time_base = TIME_BASE  # the header's template is made before any muxing sets it
        options: dict[str, object] = {
            "preset": self.settings.preset, "tune": "zerolatency", "crf": str(self.settings.crf),
            "forced-idr": "1", "g": "100000", "sc_threshold": "0",
            "threads": "1"}  # one thread: the compute budget grants it one slot
        if self.settings.profile is not None:
            options["profile"] = self.settings.profile
        stream.options = options
        self._out, self._stream, self._size = out, stream, size
        self._last_key = self._last_pts = None

    def _packets(self, packets: list[Any]) -> list[EncodedPacket]:
        kept: list[EncodedPacket] = []
        for packet in packets:
            if self._header is None:
                if not packet.is_keyframe:
                    continue
                self._header = CodecHeader.from_stream(self._stream, packet)
            if packet.is_keyframe:
                self.keyframes += 1
            kept.append(EncodedPacket(annexb_to_avcc(bytes(packet)), packet.pts, packet.dts, int(packet.duration or 0),
                                      bool(packet.is_keyframe), TIME_BASE, self._header))
        return kept


def annexb_to_avcc(data: bytes) -> bytes:
    """H.264 NAL units separated by start codes (00 00 01 or 00 00 00 01) as 4-byte big-endian
    length prefixes. Emulation prevention guarantees a start code never occurs inside a unit."""
    starts: list[tuple[int, int]] = []  # (start code position, payload position)
    at = data.find(b"\x00\x00\x01")
    while at >= 0:
        code = at - 1 if at > 0 and data[at - 1] == 0 else at
        starts.append((code, at + 3))
        at = data.find(b"\x00\x00\x01", at + 3)
    if not starts:
        return data  # already length-prefixed
    out = bytearray()
    for i, (_, payload) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(data)
        unit = data[payload:end]
        out += len(unit).to_bytes(4, "big") + unit
    return bytes(out)
