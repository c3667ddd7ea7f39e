"""Loop efficiency and latency of the whole per-frame pipeline.

For each model and stream count, in one run:
  bare      ONNX Runtime alone (`detector.infer` on pre-letterboxed tensors of the same
            frames, at the batch size the pipeline can use) — frames/s
  pipeline  ingest (PyAV decode of the sample clip) → mailbox → batcher → detector →
            tracker → NATS publish (embedded nats-server), N streams sharing one model — frames/s
  ratio     pipeline / bare   (target ≥ 0.90)

Then latency: one stream paced like a live camera (--realtime); capture → detections event
published, p50/p99, and the overhead beyond the model: total − time waiting for the model
(mailbox + batch queue) − the model call (target p99 overhead ≤ 15 ms).

Each ratio is the median of --rounds rounds, each round a pipeline run between two bare runs.

Usage: python bench/bench_loop.py [--seconds 10] [--rounds 3] [--models fall,nudenet] [--streams 1,4] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from _common import decode_frames, ensure_sample, pct, peak_rss_mb, table, write_results

from engines.models import fall_model_path, nudenet_model_path
from engines.registry import create_detector
from pipelines.detect import DetectionBatcher
from pipelines.graph import SharedEngines
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from realtime.streams.runner import StreamRunner
from tests.support.streams import camera_spec

MODELS = {"fall": fall_model_path, "nudenet": nudenet_model_path}
WARMUP_S = 3.0


def bare_fps(detector: Any, frames: list[np.ndarray], batch: int, seconds: float) -> float:
    tensors = [detector.preprocess(frames[i : i + batch]).tensor for i in range(0, len(frames) - batch + 1, batch)]
    for tensor in tensors[:2]:
        detector.infer(tensor)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        detector.infer(tensors[done % len(tensors)])
        done += 1
    return done * batch / (time.perf_counter() - started)


async def pipeline_run(
    detector: Any, publisher: NatsEventPublisher, clip: Path, streams: int, seconds: float, *, realtime: bool
) -> tuple[float, list[StreamRunner]]:
    async with DetectionBatcher(detector) as batcher:
        runners = [
            StreamRunner(camera_spec(f"bench{i}", str(clip), realtime=realtime), SharedEngines(batcher), publisher)
            for i in range(streams)
        ]
        tasks = [asyncio.create_task(r.run()) for r in runners]
        await asyncio.sleep(WARMUP_S)
        start_count = sum(r.frame_loop.stats.frames_processed for r in runners if r.frame_loop)
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        end_count = sum(r.frame_loop.stats.frames_processed for r in runners if r.frame_loop)
        elapsed = time.perf_counter() - started
        for runner in runners:
            runner.stop()
        await asyncio.gather(*tasks)
    return (end_count - start_count) / elapsed, runners


def latency_row(model: str, runner: StreamRunner) -> dict[str, Any]:
    assert runner.frame_loop is not None
    stats = runner.frame_loop.stats
    total = np.array(stats.latency_ms)
    wait = np.array(stats.wait_ms)
    model_ms = np.array(stats.inference_ms)
    overhead = total - wait - model_ms
    return {
        "model": model,
        "frames": int(total.size),
        "capture_publish_p50_ms": pct(total, 50),
        "capture_publish_p99_ms": pct(total, 99),
        "wait_for_model_p50_ms": pct(wait, 50),
        "model_p50_ms": pct(model_ms, 50),
        "overhead_p50_ms": pct(overhead, 50),
        "overhead_p99_ms": pct(overhead, 99),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    clip = ensure_sample()
    frames = decode_frames(clip, 40, start=100)
    loop_rows: list[dict[str, Any]] = []
    latency_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as store, EmbeddedNatsServer(store_dir=Path(store)) as nats:
        publisher = NatsEventPublisher(nats.url)
        await publisher.connect()
        try:
            for model in args.models:
                detector = create_detector(MODELS[model](), "onnx-cpu")
                try:
                    for streams in args.streams:
                        batch = min(streams, detector.max_batch)
                        rounds = []
                        for _ in range(args.rounds):
                            # Bare before and after each pipeline run, averaged, so drift on a shared
                            # machine hits both sides of the ratio alike; the median round is reported.
                            before = bare_fps(detector, frames, batch, args.seconds / 2)
                            piped, _ = await pipeline_run(
                                detector, publisher, clip, streams, args.seconds, realtime=False
                            )
                            bare = (before + bare_fps(detector, frames, batch, args.seconds / 2)) / 2
                            rounds.append((piped / bare, bare, piped))
                        rounds.sort()
                        ratio, bare, piped = rounds[len(rounds) // 2]
                        row = {
                            "model": model,
                            "streams": streams,
                            "batch": batch,
                            "bare_fps": round(bare, 2),
                            "pipeline_fps": round(piped, 2),
                            "ratio": round(ratio, 3),
                            "ratio_min": round(rounds[0][0], 3),
                            "ratio_max": round(rounds[-1][0], 3),
                        }
                        loop_rows.append(row)
                        print(table([row], list(row)), flush=True)
                    _, runners = await pipeline_run(detector, publisher, clip, 1, args.seconds, realtime=True)
                    latency_rows.append(latency_row(model, runners[0]))
                finally:
                    detector.close()
            await publisher.flush(timeout=10)
        finally:
            with contextlib.suppress(Exception):
                await publisher.close()
    print("\nloop efficiency (pipeline / bare ONNX Runtime, same run)")
    print(table(loop_rows, list(loop_rows[0])))
    print("\nlatency, one live-paced stream (ms)")
    print(table(latency_rows, list(latency_rows[0])))
    return {
        "seconds_per_measurement": args.seconds,
        "rounds": args.rounds,
        "loop": loop_rows,
        "latency": latency_rows,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="pipeline seconds per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per configuration (median reported)")
    parser.add_argument("--models", default="fall,nudenet")
    parser.add_argument("--streams", default="1,4")
    parser.add_argument("--quick", action="store_true", help="5 s per measurement, one round")
    args = parser.parse_args()
    args.models = args.models.split(",")
    args.streams = [int(s) for s in args.streams.split(",")]
    if args.quick:
        args.seconds, args.rounds = 5.0, 1
    result = asyncio.run(main_async(args))
    print(f"\nwrote {write_results('loop', result)}")


if __name__ == "__main__":
    main()
