"""H.264 packets made ready for a WebRTC sender without decoding: a file's length-prefixed packets
(avcC) become Annex B with the SPS and PPS in front of each keyframe, and a decoder that never saw
the file's extradata decodes them from any keyframe on."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from engines.media.h264 import AnnexB, NotH264, avcc_to_annexb, is_annexb, parameter_sets
from engines.media.remux import CodecHeader, EncodedPacket

SIZE = (64, 48)


def mp4_packets(count: int = 12, gop: int = 4) -> list[EncodedPacket]:
    """`count` frames encoded by libx264 into an MP4 in memory and demuxed again: packets as a file
    source hands them (length-prefixed, parameter sets only in the extradata)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=10, options={"g": str(gop), "bf": "0"})
        stream.width, stream.height, stream.pix_fmt = *SIZE, "yuv420p"
        for i in range(count):
            image = np.full((SIZE[1], SIZE[0], 3), (i * 20) % 255, dtype=np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        out.mux(stream.encode(None))
    buffer.seek(0)
    packets: list[EncodedPacket] = []
    with av.open(buffer, "r") as source:
        video = source.streams.video[0]
        header: CodecHeader | None = None
        for packet in source.demux(video):
            if not packet.size:
                continue
            header = header or CodecHeader.from_stream(video, packet)
            packets.append(EncodedPacket.from_av(packet, header))
    return packets


def nal_types(annexb: bytes) -> list[int]:
    return [annexb[i + 4] & 0x1F for i in range(len(annexb) - 4) if annexb[i:i + 4] == b"\x00\x00\x00\x01"]


def test_file_packets_become_annexb_with_parameter_sets_before_each_keyframe_and_decode_from_any_keyframe() -> None:
    packets = mp4_packets()
    assert not is_annexb(packets[0].data)
    ready = AnnexB(packets[0].header)
    converted = [ready.convert(p.data, p.keyframe) for p in packets]
    assert all(is_annexb(data) for data in converted)
    keyframes = [i for i, p in enumerate(packets) if p.keyframe]
    assert keyframes[:2] == [0, 4]
    for i, data in enumerate(converted):
        types = nal_types(data)
        assert (types[:2] == [7, 8]) == (i in keyframes), (i, types)
    decoder = av.CodecContext.create("h264", "r")  # no extradata: only what the packets carry
    frames = []
    for data in converted[4:]:  # a viewer that joins at the second keyframe
        frames += decoder.decode(av.Packet(data))
    frames += decoder.decode(None)
    assert len(frames) == len(packets) - 4 and (frames[0].width, frames[0].height) == SIZE


def test_annexb_packets_pass_unchanged_apart_from_the_parameter_sets() -> None:
    packets = mp4_packets(count=4)
    ready = AnnexB(packets[0].header)
    annexb = avcc_to_annexb(packets[1].data)
    assert ready.convert(annexb, keyframe=False) == annexb
    assert ready.convert(annexb, keyframe=True) == ready.parameter_sets + annexb


def test_what_is_not_h264_is_refused_in_words() -> None:
    header = CodecHeader(b"", "hevc", 64, 48)
    with pytest.raises(NotH264, match="hevc"):
        AnnexB(header)
    with pytest.raises(NotH264, match="past the packet"):
        avcc_to_annexb(b"\x00\x00\x00\x09abc")
    with pytest.raises(NotH264, match="truncated"):
        parameter_sets(b"\x01\x64\x00")
    assert parameter_sets(b"") == (b"", 0)
