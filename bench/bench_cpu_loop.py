"""The CPU detection loop against its serial bound, and how many 10 fps cameras a box carries.

Serial bound: the sample clip's frames through PyAV decode, RGB conversion, letterbox and the
bare model (one ONNX Runtime call on every core), one frame after another — what a loop that
overlaps nothing could reach. Each step is timed on its own, with the steps after the model
(NMS and box decoding, tracking, building and publishing the `detections` event), so the
breakdown says where every millisecond of a frame goes.

Loop: the whole per-stream pipeline `vidsentry run` uses (PyAV source thread → mailbox →
batcher → detector → tracker → NATS publish on an embedded nats-server), the file played as fast
as it goes, in two configurations measured in the same rounds:
  before   one model call at a time on every core, one frame in flight per stream (what shipped)
  after    the defaults: two single-thread calls side by side, workers+1 frames in flight
Efficiency = loop fps / serial-bound fps of the same round (target for 320n: ≥ 1.10).

Cameras: N copies of the clip paced like live 10 fps cameras for --camera-seconds; the largest N
with no frame dropped (mailbox replacements after a warm-up), before and after.

Usage: python bench/bench_cpu_loop.py [--model nudenet] [--seconds 8] [--rounds 3] [--cameras 3,4,5,6,7]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import av
import numpy as np
from _common import ensure_sample, pct, table, write_results

from engines.models import fall_model_path, nudenet_model_path
from engines.registry import create_detector
from pipelines.clock import StreamClock
from pipelines.detect import DetectionBatcher
from pipelines.event_bodies import detections_event
from pipelines.frames import FrameResult
from pipelines.graph import SharedEngines
from pipelines.tracker import ByteTracker
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from realtime.streams.runner import StreamRunner
from tests.support.streams import camera_spec

MODELS = {"fall": fall_model_path, "nudenet": nudenet_model_path}
WARMUP_S = 2.0
STAGE_FRAMES = 150


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    workers: int
    in_flight: int


BEFORE = Config("before", workers=1, in_flight=1)
AFTER = Config("after", workers=2, in_flight=3)


def stage_times(
    model_path: Path, clip: Path, publisher: NatsEventPublisher, loop: asyncio.AbstractEventLoop
) -> dict[str, float]:
    """Milliseconds per frame of each step, run one after another on STAGE_FRAMES frames."""
    detector = create_detector(model_path, "onnx-cpu", workers=1)  # one call on every core
    one_thread = create_detector(model_path, "onnx-cpu", threads=1, workers=1)
    spent = dict.fromkeys(
        ["decode", "convert", "letterbox", "inference", "inference_1_thread", "nms", "tracking", "publish"], 0.0
    )
    tracker, clock = ByteTracker(), StreamClock()
    names = detector.info.names
    frames = 0
    try:
        with av.open(str(clip)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"  # as the PyAV source opens files
            packets = container.demux(stream)
            while frames < STAGE_FRAMES:
                t0 = time.perf_counter()
                decoded = next(packets).decode()
                t1 = time.perf_counter()
                spent["decode"] += t1 - t0
                for frame in decoded:
                    t1 = time.perf_counter()
                    image = frame.to_ndarray(format="rgb24")
                    t2 = time.perf_counter()
                    prepared = detector.preprocess([image])
                    t3 = time.perf_counter()
                    raw = detector.infer(prepared.tensor)
                    t4 = time.perf_counter()
                    one_thread.infer(prepared.tensor)
                    t5 = time.perf_counter()
                    detections = detector.postprocess(raw, prepared)[0]
                    t6 = time.perf_counter()
                    now = clock.moment(frame.time or 0.0, time.time())
                    tracked = tracker.update(detections, now.t)
                    t7 = time.perf_counter()
                    result = FrameResult(frames, "bench", now.pts, now.t, time.time(), image.shape[1],
                                         image.shape[0], detections, (t4 - t3) * 1000)
                    event = detections_event(result, tracked.track_ids, names, model="m", backend="b", batch_size=1)
                    asyncio.run_coroutine_threadsafe(publisher.publish(event), loop).result()
                    t8 = time.perf_counter()
                    for key, value in zip(
                        ["convert", "letterbox", "inference", "inference_1_thread", "nms", "tracking", "publish"],
                        [t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, t8 - t7],
                        strict=True,
                    ):
                        spent[key] += value
                    frames += 1
    finally:
        detector.close()
        one_thread.close()
    return {key: round(value / frames * 1000, 3) for key, value in spent.items()}


def serial_fps(stages: dict[str, float]) -> float:
    return 1000 / (stages["decode"] + stages["convert"] + stages["letterbox"] + stages["inference"])


async def loop_run(
    model_path: Path, config: Config, publisher: NatsEventPublisher, clip: Path, *, streams: int, seconds: float,
    realtime: bool,
) -> dict[str, Any]:
    detector = await asyncio.to_thread(create_detector, model_path, "onnx-cpu", workers=config.workers)
    try:
        async with DetectionBatcher(detector, in_flight=config.in_flight) as batcher:
            runners = [
                StreamRunner(camera_spec(f"bench{i}", str(clip), realtime=realtime, audio=False),
                             SharedEngines(batcher), publisher)
                for i in range(streams)
            ]
            tasks = [asyncio.create_task(r.run()) for r in runners]
            await asyncio.sleep(WARMUP_S)
            loops = [r.frame_loop for r in runners]
            assert all(loops), "a stream did not start"
            processed = sum(fl.stats.frames_processed for fl in loops if fl)
            dropped = sum(fl.mailbox.stats.dropped for fl in loops if fl)
            started = time.perf_counter()
            await asyncio.sleep(seconds)
            elapsed = time.perf_counter() - started
            processed = sum(fl.stats.frames_processed for fl in loops if fl) - processed
            dropped = sum(fl.mailbox.stats.dropped for fl in loops if fl) - dropped
            latency = [v for fl in loops if fl for v in fl.stats.latency_ms]
            for runner in runners:
                runner.stop()
            await asyncio.gather(*tasks)
    finally:
        detector.close()
    return {"fps": processed / elapsed, "dropped": dropped, "latency_p50_ms": pct(latency, 50),
            "latency_p99_ms": pct(latency, 99)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    clip = ensure_sample()
    model_path = MODELS[args.model]()
    rounds: list[dict[str, Any]] = []
    stage_rows: list[dict[str, Any]] = []
    camera_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as store, EmbeddedNatsServer(store_dir=Path(store)) as nats:
        publisher = NatsEventPublisher(nats.url)
        await publisher.connect()
        loop = asyncio.get_running_loop()
        try:
            for index in range(args.rounds):
                stages = await asyncio.to_thread(stage_times, model_path, clip, publisher, loop)
                bound = serial_fps(stages)
                row: dict[str, Any] = {"round": index + 1, "serial_bound_fps": round(bound, 2)}
                for config in (BEFORE, AFTER):
                    run = await loop_run(
                        model_path, config, publisher, clip, streams=1, seconds=args.seconds, realtime=False
                    )
                    row[f"{config.name}_fps"] = round(run["fps"], 2)
                    row[f"{config.name}_efficiency"] = round(run["fps"] / bound, 3)
                rounds.append(row)
                stage_rows.append({"round": index + 1, **stages})
                print(table([row], list(row)), flush=True)
            for config in (BEFORE, AFTER):
                carried = 0
                for count in args.cameras:
                    run = await loop_run(
                        model_path, config, publisher, clip, streams=count, seconds=args.camera_seconds, realtime=True
                    )
                    camera_rows.append({"config": config.name, "cameras": count, "fps": round(run["fps"], 2),
                                        "dropped": run["dropped"], "latency_p50_ms": run["latency_p50_ms"],
                                        "latency_p99_ms": run["latency_p99_ms"]})
                    print(table([camera_rows[-1]], list(camera_rows[-1])), flush=True)
                    if run["dropped"]:
                        break
                    carried = count
                camera_rows.append({"config": config.name, "cameras": f"carried {carried}"})
            await publisher.flush(timeout=10)
        finally:
            with contextlib.suppress(Exception):
                await publisher.close()

    def median(key: str) -> float:
        return float(np.median([r[key] for r in rounds]))

    summary = {
        "serial_bound_fps": median("serial_bound_fps"),
        "before_fps": median("before_fps"),
        "after_fps": median("after_fps"),
        "before_efficiency": median("before_efficiency"),
        "after_efficiency": median("after_efficiency"),
    }
    stage_median = {
        key: round(float(np.median([r[key] for r in stage_rows])), 3) for key in stage_rows[0] if key != "round"
    }
    print(f"\nwhere a frame's time goes, serially ({args.model}, ms per frame, median of rounds)")
    print(table([stage_median], list(stage_median)))
    print("\nloop efficiency (loop fps / serial-bound fps, same round)")
    print(table(rounds, list(rounds[0])))
    print(table([summary], list(summary)))
    print("\n10 fps cameras, paced live")
    print(table(camera_rows, ["config", "cameras", "fps", "dropped", "latency_p50_ms", "latency_p99_ms"]))
    return {"model": args.model, "seconds": args.seconds, "rounds": rounds, "stages_ms": stage_median,
            "summary": summary, "cameras": camera_rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="nudenet", choices=sorted(MODELS))
    parser.add_argument("--seconds", type=float, default=8.0, help="loop seconds per configuration and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cameras", default="3,4,5,6,7", help="camera counts to try, in order")
    parser.add_argument("--camera-seconds", type=float, default=15.0)
    args = parser.parse_args()
    args.cameras = [int(c) for c in args.cameras.split(",")]
    result = asyncio.run(main_async(args))
    print(f"\nwrote {write_results(f'cpu_loop_{args.model}', result)}")


if __name__ == "__main__":
    main()
