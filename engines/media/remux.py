"""Encoded video packets, kept as the source sent them, and written out as MP4 without re-encoding.

A clip is remuxed, never re-encoded: its cost is copying bytes. Writing MP4 needs the codec's
parameters (SPS/PPS for H.264, the avcC or Annex B form, the frame size), which PyAV takes only
from a stream of an open container (`add_stream_from_template`). A camera's container closes on
every reconnect, long before a clip of its packets is written. So when a source opens, its first
keyframe is written into a small Matroska file in memory (`CodecHeader`): that file keeps the
parameters, and opening it later gives a template stream for any packet of that connection.

Timestamps are rebased so a clip starts at 0; the MP4 is fragmented (a fragment per keyframe) and
written under a temporary name, renamed only when complete, so a half-written clip is never seen
under its real name.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from engines.errors import EngineError
from engines.media.files import replacing

MP4_FLAGS = "frag_keyframe+empty_moov+default_base_moof"


class RemuxError(EngineError, ValueError):
    """Packets that cannot be written as asked (none, not starting at a keyframe, mixed sources)."""


@dataclass(frozen=True, eq=False)
class CodecHeader:
    """One connection's codec parameters, in a Matroska file holding its first keyframe. Compared by
    identity: each (re)connect makes a new one, and packets of two connections never share a clip."""

    container: bytes
    codec: str
    width: int
    height: int

    @classmethod
    def from_stream(cls, stream: Any, keyframe: Any) -> CodecHeader:
        """From an open PyAV video stream (a demuxer's or an encoder's) and one of its keyframe packets."""
        buffer = io.BytesIO()
        with _open_output(buffer, "matroska") as out:
            template = out.add_stream_from_template(stream)
            if not template.codec_context.extradata and stream.codec_context.extradata:
                # An encoder's stream (engines.media.encode) holds its parameters in its codec
                # context until its own container writes a header, which it never does.
                template.codec_context.extradata = stream.codec_context.extradata
            packet = _packet(bytes(keyframe), pts=0, dts=0, duration=keyframe.duration or 0, keyframe=True,
                             time_base=stream.time_base)
            packet.stream = template
            out.mux(packet)
        ctx = stream.codec_context  # the codec's own name: h264, not the encoder's libx264
        return cls(buffer.getvalue(), str(ctx.codec.canonical_name), int(ctx.width), int(ctx.height))


@dataclass(frozen=True, slots=True)
class EncodedPacket:
    """One video packet as the demuxer gave it (timestamps in `time_base` units)."""

    data: bytes
    pts: int | None
    dts: int | None
    duration: int
    keyframe: bool
    time_base: Fraction
    header: CodecHeader

    @classmethod
    def from_av(cls, packet: Any, header: CodecHeader) -> EncodedPacket:
        return cls(bytes(packet), packet.pts, packet.dts, int(packet.duration or 0), bool(packet.is_keyframe),
                   Fraction(packet.time_base), header)

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True, slots=True)
class Mp4Written:
    path: Path
    bytes: int
    packets: int
    duration_s: float  # from the first packet's start to the last one's end


def write_mp4(path: Path, packets: Sequence[EncodedPacket]) -> Mp4Written:
    """Write `packets` (one connection's, the first a keyframe) as a fragmented MP4 at `path`,
    atomically. Raises RemuxError for packets that cannot make a clip, OSError for the disk."""
    if not packets:
        raise RemuxError("no packets to write")
    first = packets[0]
    if not first.keyframe:
        raise RemuxError("a clip must start at a keyframe")
    if any(p.header is not first.header for p in packets):
        raise RemuxError("packets of two connections cannot share a clip")
    with replacing(path) as tmp, _open_output(str(tmp), "mp4") as out:
        base, end = _mux(out, packets)
    return Mp4Written(path, path.stat().st_size, len(packets), float((end - base) * first.time_base))


def still_at(packets: Sequence[EncodedPacket], offset_s: float) -> tuple[Any, float]:
    """The picture shown `offset_s` after the first packet (a keyframe) of `packets`: the last
    frame decoded at or before it, as RGB (an ndarray), and that frame's own offset. Decodes the
    packets from the keyframe on (a GOP at most, as `PacketRing.span` cuts them). RemuxError when
    nothing decodes."""
    if not packets or not packets[0].keyframe:
        raise RemuxError("a still is decoded from a keyframe on")
    if any(p.header is not packets[0].header for p in packets):
        raise RemuxError("packets of two connections")
    import av

    buffer = io.BytesIO()
    with _open_output(buffer, "matroska") as out:
        _mux(out, packets)
    buffer.seek(0)
    best: tuple[Any, float] | None = None
    with av.open(buffer, "r", format="matroska") as source:
        try:
            for frame in source.decode(video=0):
                at = float(frame.time or 0.0)
                if best is not None and at > offset_s + 1e-3:
                    break  # frames come in display order: the one before was the one on screen
                best = (frame.to_ndarray(format="rgb24"), at)
        except av.error.FFmpegError as exc:  # a corrupt packet: what decoded before it still counts
            if best is None:
                raise RemuxError(f"the packets do not decode: {exc}") from None
    if best is None:
        raise RemuxError("no frame decoded")
    return best


def _mux(out: Any, packets: Sequence[EncodedPacket]) -> tuple[int, int]:
    """Write `packets` (one connection's) into the open container `out`, from time 0; returns the
    base and end timestamps in the packets' time base."""
    import av

    first = packets[0]
    stamps = _timestamps(packets)
    base = min(stamps[0])
    with av.open(io.BytesIO(first.header.container), "r", format="matroska") as source:
        stream = out.add_stream_from_template(source.streams.video[0])
        for item, (pts, dts) in zip(packets, stamps, strict=True):
            packet = _packet(item.data, pts=pts - base, dts=dts - base, duration=item.duration,
                             keyframe=item.keyframe, time_base=item.time_base)
            packet.stream = stream
            out.mux(packet)
    return base, max(pts for pts, _ in stamps) + packets[-1].duration


def _timestamps(packets: Sequence[EncodedPacket]) -> list[tuple[int, int]]:
    """(pts, dts) of each packet, with the gaps filled: an RTSP demuxer gives the first packets of
    a connection no timestamps until the sender's clock is known. A packet without them follows
    the one before it by that one's duration, or precedes the next known one by its own."""
    known: list[int | None] = [p.dts if p.dts is not None else p.pts for p in packets]
    first = next((i for i, dts in enumerate(known) if dts is not None), None)
    if first is None:
        raise RemuxError("no packet has a timestamp")
    for i in range(first - 1, -1, -1):
        after = known[i + 1]
        assert after is not None
        known[i] = after - max(1, packets[i].duration)
    stamps: list[tuple[int, int]] = []
    previous: int | None = None
    for i, packet in enumerate(packets):
        stamp = known[i]
        if previous is not None:  # strictly increasing decode times, as MP4 needs
            stamp = max(previous + max(1, packets[i - 1].duration) if stamp is None else stamp, previous + 1)
        assert stamp is not None
        pts = packet.pts if packet.pts is not None and packet.pts >= stamp else stamp
        stamps.append((pts, stamp))
        previous = stamp
    return stamps


def _open_output(target: Any, fmt: str) -> Any:
    import av

    options = {"movflags": MP4_FLAGS} if fmt == "mp4" else {}
    return av.open(target, "w", format=fmt, options=options)


def _packet(data: bytes, *, pts: int | None, dts: int, duration: int, keyframe: bool, time_base: Fraction) -> Any:
    import av

    packet = av.Packet(data)
    packet.pts = pts
    packet.dts = dts
    packet.duration = duration
    packet.time_base = time_base
    packet.is_keyframe = keyframe
    return packet
