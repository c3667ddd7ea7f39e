"""What a stream's pre-event clip buffer costs, and what writing a clip costs (issue 21).

The buffer's work per packet is what the source would add to its demux loop: copy the packet out
(`EncodedPacket.from_av`) and put it in the ring (`PacketRing.append`, dropping whole GOPs past
`--buffer-s`). Demuxing itself is not counted: the source demuxes every packet anyway. The CPU
time of that work, over the media seconds it covered, is the buffer's share of one core at the
stream's own rate (the condition a live camera runs in; measured here on packets read from files
as fast as they come, which changes nothing per packet). Two inputs: the sample clip (768x576,
10 fps) and a generated 1920x1080 25 fps H.264 clip at --mbps (a 1080p camera's bitrate). Then
`--clip-s` of each is written as an MP4 (remux, `write_mp4`), timed, and exported with four
boxes pixelated on every frame (`redact_mp4`: decode, mosaic, x264 veryfast), timed per clip-minute.

A browser session (or GStreamer ingest) hands decoded frames, which the clips stage encodes itself
(`FrameEncoder`: x264 ultrafast, zerolatency, one thread). The second table is that cost: the
sample's frames decoded once, scaled to 640x480 and 1280x720, encoded one by one (CPU time per
frame, excluding the decode the session does anyway), as a share of one core at 15 fps (a browser
camera's usual rate), and the bytes per clip-minute it makes.

Usage: .venv/bin/python bench/bench_clip_buffer.py [--buffer-s 60] [--mbps 6] [--clip-s 15]
Results: bench/results/bench_clip_buffer.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
from _common import ensure_sample, table, write_results

from engines.media.encode import FrameEncoder
from engines.media.redact import redact_mp4
from engines.media.remux import CodecHeader, EncodedPacket, write_mp4
from pipelines.clips.ring import PacketRing


def make_1080p(path: Path, seconds: float, mbps: float) -> None:
    """A 1080p25 H.264 clip with motion and texture, so the encoder spends its bitrate."""
    rng = np.random.default_rng(0)
    texture = rng.integers(0, 255, (1080, 1920), dtype=np.uint8)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 1920, 1080, "yuv420p"
        stream.bit_rate = int(mbps * 1e6)
        stream.options = {"preset": "ultrafast", "g": "50"}
        for i in range(round(seconds * 25)):
            shifted = np.roll(texture, (i * 7, i * 11), axis=(0, 1))
            rgb = np.stack([shifted, np.roll(shifted, 400, axis=1), np.full_like(shifted, i % 255)], axis=-1)
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def measure(path: Path, buffer_s: float, clip_s: float, out_dir: Path) -> dict[str, Any]:
    ring = PacketRing(max_s=buffer_s, max_bytes=1 << 34)
    cpu = 0.0
    header: CodecHeader | None = None
    header_s = 0.0
    first_t: float | None = None
    last_t = 0.0
    payload = 0
    packets = 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        for packet in container.demux(stream):
            if not packet.size or packet.pts is None:
                continue
            t = float(packet.pts * packet.time_base)
            began = time.process_time()
            if header is None:
                if not packet.is_keyframe:
                    continue
                header = CodecHeader.from_stream(stream, packet)
                header_s = time.process_time() - began
            ring.append(t, EncodedPacket.from_av(packet, header))
            cpu += time.process_time() - began
            first_t = t if first_t is None else first_t
            last_t = max(last_t, t)
            payload += packet.size
            packets += 1
    assert first_t is not None
    media_s = last_t - first_t + (1 / 25)
    newest = ring.newest_t or 0.0
    span = ring.span(newest - clip_s, newest)
    began = time.perf_counter()
    written = write_mp4(out_dir / f"{path.stem}.mp4", [item.packet for item in span])
    write_s = time.perf_counter() - began
    # Export with redaction: four person-sized boxes pixelated on every frame, re-encoded (x264 veryfast).
    boxes = [(round(i / 25, 3), [(w * width / 5, height / 4, w * width / 5 + width / 8, height * 3 / 4)
                                 for w in range(4)]) for i in range(round(written.duration_s * 25) + 25)]
    began = time.perf_counter()
    redacted = redact_mp4(written.path, out_dir / f"{path.stem}-redacted.mp4", boxes)
    redact_s = time.perf_counter() - began
    return {
        "input": f"{path.name} {width}x{height}",
        "media_s": round(media_s, 1),
        "mbps": round(payload * 8 / media_s / 1e6, 2),
        "packets": packets,
        "us_per_packet": round(cpu / packets * 1e6, 1),
        "core_pct": round(cpu / media_s * 100, 3),
        "header_ms": round(header_s * 1e3, 2),
        "ring_mb": round(ring.bytes / 1e6, 1),
        "clip_s": round(written.duration_s, 2),
        "clip_mb": round(written.bytes / 1e6, 2),
        "write_ms": round(write_s * 1e3, 1),
        "mb_per_clip_min": round(written.bytes / 1e6 / written.duration_s * 60, 1),
        "redact_s_per_clip_min": round(redact_s / written.duration_s * 60, 1),
        "redacted_frames": redacted.frames,
    }


def measure_encode(path: Path, size: tuple[int, int], fps: float, frames: int = 300) -> dict[str, Any]:
    images: list[np.ndarray] = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            images.append(frame.to_ndarray(format="rgb24", width=size[0], height=size[1]))
            if len(images) == frames:
                break
    encoder = FrameEncoder()
    cpu = 0.0
    size_bytes = 0
    for i, image in enumerate(images):
        began = time.process_time()
        packets = encoder.encode(image, i / fps)
        cpu += time.process_time() - began
        size_bytes += sum(p.size for p in packets)
    encoder.close()
    media_s = len(images) / fps
    return {
        "input": f"{path.name} as {size[0]}x{size[1]} at {fps:g} fps",
        "frames": len(images),
        "ms_per_frame": round(cpu / len(images) * 1e3, 2),
        "core_pct": round(cpu / media_s * 100, 2),
        "keyframes": encoder.keyframes,
        "mb_per_clip_min": round(size_bytes / 1e6 / media_s * 60, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buffer-s", type=float, default=60.0)
    parser.add_argument("--mbps", type=float, default=6.0)
    parser.add_argument("--clip-s", type=float, default=15.0)
    parser.add_argument("--hd-seconds", type=float, default=40.0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="vidsentry-clipbench-") as tmp:
        out = Path(tmp)
        hd = out / "hd1080.mp4"
        print(f"encoding {args.hd_seconds:g} s of 1080p25 at {args.mbps:g} Mbit/s ...", flush=True)
        make_1080p(hd, args.hd_seconds, args.mbps)
        for path in (ensure_sample(), hd):
            rows.append(measure(path, args.buffer_s, args.clip_s, out))
            print(f"measured {path.name}", flush=True)
        encoded = [measure_encode(ensure_sample(), size, 15.0) for size in ((640, 480), (1280, 720))]
    print(table(rows, list(rows[0])))
    print("\nframes encoded for clips (sources without packets: browser sessions, GStreamer)")
    print(table(encoded, list(encoded[0])))
    path = write_results("bench_clip_buffer", {"buffer_s": args.buffer_s, "clip_s": args.clip_s, "rows": rows,
                                               "encoded": encoded})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
