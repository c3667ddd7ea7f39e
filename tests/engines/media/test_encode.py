"""Frames encoded for clips (engines.media.encode): keyframes by media time, packets a clip and a
still are made from exactly like a camera's, and what H.264 cannot take refused."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from engines.media.encode import EncoderSettings, FrameEncoder, annexb_to_avcc
from engines.media.h264 import AnnexB
from engines.media.remux import still_at, write_mp4
from pipelines.clips.ring import PacketRing


def moving(i: int, size: tuple[int, int] = (240, 320)) -> np.ndarray:
    image = np.zeros((*size, 3), np.uint8)
    image[:, :, 2] = 60
    x = (i * 7) % (size[1] - 40)
    image[100:140, x:x + 40] = (250, 200, 30)  # a bright square crossing the picture
    return image


def test_frames_at_an_uneven_rate_become_a_clip_with_keyframes_by_time(tmp_path: Path) -> None:
    encoder = FrameEncoder()
    ring = PacketRing(max_s=60.0, max_bytes=1 << 26)
    # 12 fps, then 4 fps (a thinned stream): keyframes still every 2 s of media time.
    times = [5.0 + i / 12 for i in range(48)] + [9.0 + i / 4 for i in range(16)]
    for i, t in enumerate(times):
        for packet in encoder.encode(moving(i), t):
            ring.put(t, packet)
    assert encoder.frames == len(times) and ring.stats.packets == len(times)
    assert encoder.keyframes == 4  # at 5, 7, 9 and 11 s (the last frame is at 12.75 s)
    span = ring.cut(7.5, 11.2)
    assert span[0].t == pytest.approx(7.0) and span[0].packet.keyframe
    written = write_mp4(tmp_path / "clip.mp4", [item.packet for item in span])
    with av.open(str(written.path)) as container:
        assert container.streams.video[0].codec_context.name == "h264"
        frames = list(container.decode(video=0))
    assert len(frames) == len(span) and frames[0].key_frame
    assert [round(f.time, 3) for f in frames] == [round(item.t - 7.0, 3) for item in span]
    # The picture survives: the square is where it was drawn.
    index = len(frames) // 2
    shown = frames[index].to_ndarray(format="rgb24")
    sent = moving(times.index(span[index].t))
    assert np.abs(shown.astype(int) - sent.astype(int)).mean() < 6
    # A still decoded from the same packets is the frame on screen at that moment.
    image, at = still_at([item.packet for item in ring.cut(9.6, 9.6)], 0.6)
    assert at == pytest.approx(0.5) and image.shape == (240, 320, 3)


def test_a_new_frame_size_starts_a_new_header_and_time_must_advance() -> None:
    encoder = FrameEncoder()
    first = encoder.encode(moving(0), 1.0)
    assert encoder.encode(moving(1), 1.0) == []  # the same pts again: dropped
    resized = encoder.encode(moving(2, (480, 640)), 1.1)
    assert first[0].header is not resized[0].header and resized[0].keyframe
    assert (resized[0].header.width, resized[0].header.height) == (640, 480)
    # A reconnect: the source's clock starts again near 0. A new encoder (a new header) takes it on.
    before = resized[0].header
    again = encoder.encode(moving(3, (480, 640)), 0.2)
    assert again and again[0].keyframe and again[0].header is not before
    assert encoder.encode(moving(4, (480, 640)), 0.25)  # and goes on from there
    with pytest.raises(ValueError, match="even dimensions"):
        encoder.encode(np.zeros((241, 320, 3), np.uint8), 2.0)
    encoder.close()


def test_start_codes_become_length_prefixes() -> None:
    annexb = b"\x00\x00\x00\x01\x67\x42\x00\x00\x01\x68\xce\x00\x00\x00\x01\x65\x88\x84"
    assert annexb_to_avcc(annexb) == (b"\x00\x00\x00\x02\x67\x42" b"\x00\x00\x00\x02\x68\xce"
                                      b"\x00\x00\x00\x03\x65\x88\x84")
    assert annexb_to_avcc(b"\x00\x00\x00\x02\x67\x42") == b"\x00\x00\x00\x02\x67\x42"


def test_live_settings_scale_wide_frames_write_constrained_baseline_and_key_a_frame_on_demand() -> None:
    # What live viewers get (realtime.webrtc.live_encode): a 4K-wide frame costs a 1280-wide
    # encode, the profile is the one every browser takes, and a keyframe comes when asked.
    encoder = FrameEncoder(EncoderSettings(keyint_s=1.0, profile="baseline", max_width=1280))
    assert encoder.target_size(3840, 2160) == (1280, 720)
    assert encoder.target_size(641, 481) == (640, 480)  # even, so odd browser sizes are taken
    assert encoder.target_size(3841, 2161) == (1280, 720)
    packets = []
    for i in range(6):
        if i == 3:
            encoder.keyframe_next()
        packets += encoder.encode(moving(i, (2160, 3840)), i / 10)
    assert encoder.running and encoder.encoded_size == (1280, 720)
    assert [p.keyframe for p in packets] == [True, False, False, True, False, False]
    header = packets[0].header
    assert (header.width, header.height) == (1280, 720)
    annexb = AnnexB(header)
    sps = annexb.parameter_sets[4:]
    assert sps[0] & 0x1F == 7 and sps[1] == 66 and sps[2] & 0x40  # profile_idc 66, constraint_set1: Constrained
    decoder = av.CodecContext.create("h264", "r")
    decoded = []
    for packet in packets:
        decoded += decoder.decode(av.Packet(annexb.convert(packet.data, packet.keyframe)))
    assert len(decoded) == 6 and (decoded[0].width, decoded[0].height) == (1280, 720)
    encoder.close()
    assert not encoder.running
