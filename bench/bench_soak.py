"""Memory soak: N live RTSP cameras (a real GStreamer RTSP server's endless live mount:
x264 video + Opus audio) through the whole pipeline for a while; peak RSS and RSS growth.

Growth is measured from the end of the warm-up (first minute: models, codecs and buffers
settle) to the end of the run. Target: growth ≤ 5 % over 10 minutes with 4 streams.

Usage: python bench/bench_soak.py [--minutes 10] [--streams 4] [--model fall|nudenet]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, current_rss_mb, ensure_sample, peak_rss_mb, table, write_results

from engines.models import fall_model_path, nudenet_model_path
from engines.registry import create_detector
from pipelines.detect import DetectionBatcher
from pipelines.graph import SharedEngines
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from realtime.streams.runner import StreamRunner
from tests.support.streams import camera_spec

MODELS = {"fall": fall_model_path, "nudenet": nudenet_model_path}


def start_rtsp_server(clip: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "rtsp_server.py"), "--port", "0", "--clip", str(clip)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        proc.kill()
        raise SystemExit(f"RTSP server did not start: {line}")
    return proc, int(line[1])


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    clip = ensure_sample()
    server, port = start_rtsp_server(clip)
    samples: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory() as store, EmbeddedNatsServer(store_dir=Path(store)) as nats:
            publisher = NatsEventPublisher(nats.url)
            await publisher.connect()
            detector = create_detector(MODELS[args.model](), "onnx-cpu")
            async with DetectionBatcher(detector) as batcher:
                runners = [
                    StreamRunner(
                        camera_spec(f"soak{i}", f"rtsp://127.0.0.1:{port}/test"), SharedEngines(batcher), publisher
                    )
                    for i in range(args.streams)
                ]
                tasks = [asyncio.create_task(r.run()) for r in runners]
                started = time.monotonic()
                duration = args.minutes * 60
                while (elapsed := time.monotonic() - started) < duration:
                    await asyncio.sleep(min(args.interval, duration - elapsed))
                    processed = sum(r.summary().frames_processed for r in runners)
                    sample = {
                        "t_s": round(time.monotonic() - started, 1),
                        "rss_mb": round(current_rss_mb(), 1),
                        "frames_processed": processed,
                    }
                    samples.append(sample)
                    print(f"t={sample['t_s']:7.1f}s  rss={sample['rss_mb']:8.1f} MB  processed={processed}", flush=True)
                for runner in runners:
                    runner.stop()
                await asyncio.gather(*tasks)
                summaries = [r.summary() for r in runners]
            detector.close()
            with contextlib.suppress(Exception):
                await publisher.close()
    finally:
        server.terminate()
        server.wait(10)
    warm = next((s for s in samples if s["t_s"] >= args.warmup), samples[0])
    final = samples[-1]
    growth = (final["rss_mb"] - warm["rss_mb"]) / warm["rss_mb"] * 100
    result = {
        "streams": args.streams,
        "model": args.model,
        "minutes": args.minutes,
        "rss_after_warmup_mb": warm["rss_mb"],
        "rss_final_mb": final["rss_mb"],
        "rss_growth_pct": round(growth, 2),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "frames_processed": final["frames_processed"],
        "frames_dropped": sum(s.frames_dropped for s in summaries),
        "reconnects": sum(s.reconnects for s in summaries),
        "samples": samples,
    }
    row = {k: v for k, v in result.items() if k != "samples"}
    print(table([row], list(row)))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--model", choices=sorted(MODELS), default="fall")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between RSS samples")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the growth baseline")
    args = parser.parse_args()
    result = asyncio.run(soak(args))
    print(f"wrote {write_results('soak', result)}")


if __name__ == "__main__":
    main()
