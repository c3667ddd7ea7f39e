"""H.264 packets as a WebRTC sender wants them: Annex B, each keyframe carrying its SPS and PPS.

A camera's packets come in either form: an RTSP demuxer gives Annex B (start codes), an MP4 or
Matroska file gives length-prefixed units (avcC) with the parameter sets only in the codec's
extradata. aiortc's H.264 packetizer splits on start codes, and a viewer that joins mid-stream
can decode nothing until it has the parameter sets, so both are fixed here without decoding.
"""

from __future__ import annotations

import io

from engines.errors import EngineError
from engines.media.remux import CodecHeader

START_CODE = b"\x00\x00\x00\x01"


class NotH264(EngineError, ValueError):
    """The packets are not H.264, or their codec parameters cannot be read."""


def is_annexb(data: bytes) -> bool:
    return data.startswith(START_CODE) or data.startswith(b"\x00\x00\x01")


def avcc_to_annexb(data: bytes, length_size: int = 4) -> bytes:
    """Length-prefixed NAL units as start-code separated ones. NotH264 when the lengths do not
    add up to the packet."""
    out = bytearray()
    at = 0
    while at < len(data):
        if at + length_size > len(data):
            raise NotH264("a truncated NAL unit length")
        size = int.from_bytes(data[at:at + length_size], "big")
        at += length_size
        if size == 0 or at + size > len(data):
            raise NotH264("a NAL unit length past the packet's end")
        out += START_CODE + data[at:at + size]
        at += size
    return bytes(out)


def parameter_sets(extradata: bytes) -> tuple[bytes, int]:
    """The SPS and PPS of an extradata as Annex B, and the NAL length size of the packets (0 when
    they are Annex B already). An avcC record starts with version 1; anything else is Annex B."""
    if not extradata:
        return b"", 0
    if extradata[0] != 1:
        return extradata, 0
    if len(extradata) < 7:
        raise NotH264("a truncated avcC record")
    length_size = (extradata[4] & 0x03) + 1
    out = bytearray()
    at = 5
    for count_mask in (0x1F, 0xFF):  # the SPS count has 3 reserved bits; the PPS count none
        if at >= len(extradata):
            raise NotH264("a truncated avcC record")
        count = extradata[at] & count_mask
        at += 1
        for _ in range(count):
            size = int.from_bytes(extradata[at:at + 2], "big")
            at += 2
            if at + size > len(extradata):
                raise NotH264("a parameter set past the avcC record's end")
            out += START_CODE + extradata[at:at + size]
            at += size
    return bytes(out), length_size


class AnnexB:
    """One connection's packets (one CodecHeader) made ready to send: Annex B, and the parameter
    sets in front of every keyframe (cheap: tens of bytes per keyframe)."""

    def __init__(self, header: CodecHeader) -> None:
        if header.codec != "h264":
            raise NotH264(f"the stream's video is {header.codec}, not h264")
        self.header = header
        self.parameter_sets, self._length_size = parameter_sets(_extradata(header))

    def convert(self, data: bytes, keyframe: bool) -> bytes:
        if not is_annexb(data):
            data = avcc_to_annexb(data, self._length_size or 4)
        return self.parameter_sets + data if keyframe else data


def _extradata(header: CodecHeader) -> bytes:
    import av

    try:
        with av.open(io.BytesIO(header.container), "r", format="matroska") as source:
            return bytes(source.streams.video[0].codec_context.extradata or b"")
    except av.error.FFmpegError as exc:
        raise NotH264(f"the codec header cannot be read: {exc}") from None
