"""Clips written without re-encoding, from real demuxed packets: the sample file (H.264 in MP4,
length-prefixed NAL units) and a live RTSP camera (Annex B). The MP4 opens in PyAV, starts at a
keyframe at 0, holds every packet given, and its frames are the source's frames."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from engines.media.remux import CodecHeader, EncodedPacket, RemuxError, still_at, write_mp4
from pipelines.clips.ring import PacketRing
from tests.support.rtsp import RtspServer


def demux(url: str, *, seconds: float | None = None, options: dict[str, str] | None = None) -> list[EncodedPacket]:
    """The video packets of a source from its first keyframe, with its codec header: all of them,
    or until their timestamps span `seconds` (media time: the connect and probing of a live source
    do not count; 30 s of wall clock is only a bound against a source that stops sending)."""
    packets: list[EncodedPacket] = []
    header: CodecHeader | None = None
    deadline = time.monotonic() + 30.0
    with av.open(url, options=options or {}) as container:
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            if not packet.size:
                continue
            if header is None:
                if not packet.is_keyframe:
                    continue
                header = CodecHeader.from_stream(stream, packet)
            packets.append(EncodedPacket.from_av(packet, header))
            if seconds is None or packet.pts is None:
                continue
            start = next(p.pts for p in packets if p.pts is not None)  # RTSP's first keyframe may have none
            if (packet.pts - start) * packet.time_base >= seconds:
                break
            assert time.monotonic() < deadline, f"{len(packets)} packets in 30 s did not span {seconds} s"
    return packets


def frames(path: Path | str, limit: int | None = None) -> list[Any]:
    with av.open(str(path)) as container:
        out = []
        for frame in container.decode(video=0):
            out.append(frame)
            if limit is not None and len(out) >= limit:
                break
        return out


@pytest.fixture(scope="module")
def sample_packets(sample_dir: Path) -> list[EncodedPacket]:
    return demux(str(sample_dir / "vtest_speech.mp4"))


def test_a_span_of_the_sample_becomes_an_mp4_of_exactly_its_frames(
    sample_packets: list[EncodedPacket], sample_dir: Path, tmp_path: Path
) -> None:
    ring = PacketRing(max_s=60.0, max_bytes=10**9)
    for packet in sample_packets:
        assert packet.pts is not None
        ring.append(float(packet.pts * packet.time_base), packet)
    span = ring.span(30.35, 40.0)  # the keyframe before 30.35 s starts it
    assert span[0].packet.keyframe and span[0].t <= 30.35
    written = write_mp4(tmp_path / "clip.mp4", [item.packet for item in span])
    assert written.packets == len(span) and written.bytes == (tmp_path / "clip.mp4").stat().st_size
    assert not list(tmp_path.glob(".*.part"))  # nothing half-written left behind
    clip = frames(tmp_path / "clip.mp4")
    assert len(clip) == len(span)
    assert clip[0].key_frame and clip[0].time == 0.0
    assert abs(written.duration_s - (span[-1].t - span[0].t + 0.1)) < 1e-6  # 10 fps: the last frame's 0.1 s
    # The same pictures as the source at the same times (remuxed, not re-encoded).
    source = [f for f in frames(sample_dir / "vtest_speech.mp4", limit=450) if f.time is not None]
    by_time = {round(f.time, 3): f for f in source}
    for frame in (clip[0], clip[len(clip) // 2], clip[-1]):
        original = by_time[round(frame.time + span[0].t, 3)]
        assert np.array_equal(frame.to_ndarray(format="gray"), original.to_ndarray(format="gray"))


def test_a_still_is_the_source_picture_shown_at_that_time(
    sample_packets: list[EncodedPacket], sample_dir: Path
) -> None:
    ring = PacketRing(max_s=60.0, max_bytes=10**9)
    for packet in sample_packets:
        assert packet.pts is not None
        ring.append(float(packet.pts * packet.time_base), packet)
    source = {round(f.time, 3): f for f in frames(sample_dir / "vtest_speech.mp4", limit=400) if f.time is not None}
    for t in (31.0, 33.47, 35.0):  # a keyframe, between two frames, later in its GOP
        span = ring.span(t, t)
        image, at = still_at([item.packet for item in span], t - span[0].t)
        shown = round(span[0].t + at, 3)
        assert shown <= t + 1e-3 and t - shown < 0.1 + 1e-3  # the frame on screen at t (10 fps)
        original = source[shown].to_ndarray(format="rgb24")
        assert image.shape == original.shape and np.array_equal(image, original)
    with pytest.raises(RemuxError, match="keyframe"):
        still_at(sample_packets[1:5], 0.0)


def test_packets_that_cannot_make_a_clip_are_refused(sample_packets: list[EncodedPacket], tmp_path: Path) -> None:
    with pytest.raises(RemuxError, match="no packets"):
        write_mp4(tmp_path / "a.mp4", [])
    with pytest.raises(RemuxError, match="keyframe"):
        write_mp4(tmp_path / "a.mp4", sample_packets[1:5])
    other = CodecHeader(sample_packets[0].header.container, "h264", 1, 1)
    mixed = [*sample_packets[:3], EncodedPacket(b"x", 0, 0, 1, True, sample_packets[0].time_base, other)]
    with pytest.raises(RemuxError, match="two connections"):
        write_mp4(tmp_path / "a.mp4", mixed)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_live_rtsp_cameras_packets_become_a_playable_clip(rtsp_server: RtspServer, tmp_path: Path) -> None:
    packets = demux(rtsp_server.url("/test"), seconds=2.0, options={"rtsp_transport": "tcp"})
    assert packets and packets[0].keyframe
    written = write_mp4(tmp_path / "live.mp4", packets)
    clip = frames(tmp_path / "live.mp4")
    assert len(clip) == len(packets) and clip[0].key_frame and clip[0].time == 0.0
    assert written.duration_s > 1.0
    with av.open(str(tmp_path / "live.mp4")) as container:
        assert container.streams.video[0].codec_context.name == packets[0].header.codec
