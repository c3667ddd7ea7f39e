"""Scene descriptions: prefix-cache reuse, description lag, bytes and requests, against the vLLM simulator.

Four streams of vtest.avi (each from its own offset, 10 fps) run through the real describer stage
(sampling, window, one description and one alert check in flight per stream, the real VLM
client) for `--minutes` of simulated time. The clock is accelerated `--speed` times: frames'
media and capture times advance that much faster than the wall clock, and the simulator's
latency is divided by it, so every figure below is in simulated seconds. The simulator
(tests/support/vllm_sim.py) renders each prompt as Qwen2.5-VL's chat template does, 4 bytes of
text per token and one token per 28x28 px of image, and caches 16-token blocks chained from a
`cache_salt`-seeded first block, as vLLM's automatic prefix caching does; `cached_tokens` is
what it reports per request.

Two scenes: `quiet` (the describer's activity sampling on vtest: a frame when something moves,
at most one a second) and `busy` (every sampled frame counts as motion: one a second, always).
Variants, the same frames, sampling and cadence:
  append-only   the describer's: byte-identical system prompt, an epoch header, chronological
                [t=...] frames and speech, earlier answers as assistant turns, the instruction last;
                a new epoch (the last description as its summary) at the frame or token budget;
                run with the defaults, with the old 24-frame epochs, and with every image's data
                sent in every request (no uuid-only images: the bytes before), and against the
                other servers users run (busy scene): one that takes images only as data URLs
                (vLLM before 0.11, SGLang, llama.cpp, Ollama, LM Studio), one whose model wraps
                the JSON in prose, one that answers in prose only, one that refuses cache_salt
                and priority; the client learns each from the server's answers
  naive         stateless: the instruction (with the time) first, then the newest 8 frames (a
                sliding window) and the recent speech, no history

Reported per layout: cached / prompt tokens over every request (target >= 0.85 for append-only),
prefill tokens computed per stream-minute, description lag (publish time minus the capture time
of the newest frame the description saw) p50 / p99, request bytes and requests per
stream-minute, descriptions per stream-minute.

Request bytes are what the client sent (VlmStats.request_bytes: images the server already holds go
by uuid alone).

Usage: python bench/bench_vlm.py [--streams 4] [--minutes 10] [--speed 4] [--latency-s 0.35]
                                  [--per-token-s 0.015] [--scenes quiet,busy]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from _common import ROOT, decode_frames, ensure_sample, pct, table, write_results

from engines.vlm.client import VlmClient, VlmSettings, create_vlm_client
from engines.vlm.types import VlmMessage, VlmRequest, VlmResponse, VlmText
from pipelines.describe.rules import VlmRule
from pipelines.describe.settings import DescribeEngine, DescribeSettings
from pipelines.describe.stage import DescribeStage
from pipelines.describe.window import DescribeWindow, Item, WindowFrame, WindowRequest, WindowSpeech, stamp
from pipelines.event_bodies import caption_event
from pipelines.events import Event, EventKind
from pipelines.frames import VideoFrame
from pipelines.graph.stage import ObservedSink
from pipelines.mailbox import FrameMailbox
from tests.support.vllm_sim import VllmSimulator

VTEST = ROOT / ".cache" / "samples" / "vtest.avi"
FPS = 10.0
CLIP_FRAMES = 795  # vtest.avi: 79.5 s at 10 fps, looped
SPEECH_EVERY_S = 15.0  # a caption segment this often (simulated), as a talkative scene would have
CHECK = VlmRule(id="running", type="vlm", question="Is anyone running?", cadence_s=10.0)
TARGET_REUSE = 0.9
NAIVE_FRAMES = 8  # the naive layout's sliding window


class SimClock:
    """Simulated epoch seconds: the wall clock, `speed` times faster, from when it was made."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._wall0 = time.time()
        self._mono0 = time.monotonic()

    def __call__(self) -> float:
        return self._wall0 + (time.monotonic() - self._mono0) * self.speed


class MeteredClient:
    """The real client, counting requests; bytes are what the client itself put on the wire."""

    def __init__(self, client: VlmClient, model: str) -> None:
        self._client = client
        self._model = model
        self.requests = 0

    @property
    def bytes(self) -> int:
        return self._client.stats().request_bytes

    async def complete(self, request: VlmRequest) -> VlmResponse:
        self.requests += 1
        return await self._client.complete(request)

    def image_limit(self, route_key: str) -> int | None:
        return self._client.image_limit(route_key)


class NaiveWindow(DescribeWindow):
    """The layout most first attempts use: instruction first (with the time), then a sliding window
    of the newest frames and recent speech; stateless, so nothing after the first text is stable."""

    def __init__(self, settings: DescribeSettings) -> None:
        super().__init__(settings)
        self._recent: list[Item] = []

    @property
    def frames(self) -> int:
        return 0  # a sliding window never rolls

    def add_frame(self, frame: WindowFrame) -> None:
        super().add_frame(frame)
        self._recent.append(frame)
        frames = [i for i in self._recent if isinstance(i, WindowFrame)]
        if len(frames) > NAIVE_FRAMES:  # slide: the oldest frame, and speech before the next, go
            first = frames[-NAIVE_FRAMES].t
            self._recent = [i for i in self._recent if i.t >= first]

    def add_speech(self, t: float, text: str) -> None:
        super().add_speech(t, text)
        if text.strip():
            self._recent.append(WindowSpeech(t, text))

    def answer(self, epoch: int, text: str) -> None:
        return

    def request(self, instruction: str, *, keep: bool = False) -> WindowRequest:
        self._pending = []
        items = sorted(self._recent, key=lambda i: i.t)
        frames = [i for i in items if isinstance(i, WindowFrame)]
        now = frames[-1].t if frames else 0.0
        parts: list[Any] = [VlmText(f"Current time t={now:.1f}s. {instruction}"), VlmText(self.settings.system_prompt)]
        for item in items:
            if isinstance(item, WindowFrame):
                parts.append(item.image)
            else:
                parts.append(VlmText(f'{stamp(item.t)} speech: "{item.text}"'))
        newest = frames[-1] if frames else None
        return WindowRequest(
            epoch=1,
            messages=(VlmMessage("user", tuple(parts)),),
            frames=len(frames),
            window_start_pts=frames[0].pts if frames else None,
            window_end_pts=newest.pts if newest else None,
            newest_captured_at=newest.captured_at if newest else None,
            tokens=0,
        )


@dataclass
class Collected:
    clock: SimClock
    lags: list[float] = field(default_factory=list)
    descriptions: int = 0
    alerts: int = 0

    async def publish(self, event: Event) -> None:
        if event.kind is EventKind.DESCRIPTIONS:
            self.descriptions += 1
            self.lags.append(self.clock() - event.captured_at)
        elif event.kind is EventKind.ALERTS:
            self.alerts += 1


async def feed(
    stage: DescribeStage,
    mailbox: FrameMailbox,
    sink: ObservedSink,
    frames: list[np.ndarray],
    *,
    stream: int,
    clock: SimClock,
    seconds: float,
    stream_id: str,
) -> None:
    start = clock()
    offset = (stream * len(frames)) // 4
    seq = 0
    next_speech = SPEECH_EVERY_S / 2
    while (now := clock()) - start < seconds:
        pts = seq / FPS
        due = start + pts
        if due > now:
            await asyncio.sleep((due - now) / clock.speed)
        mailbox.put(VideoFrame(stream_id, seq, pts, clock(), frames[(offset + seq) % len(frames)]))
        if pts >= next_speech:
            words = [
                (" Someone", pts, pts + 0.4, 0.9),
                (" crosses", pts + 0.4, pts + 0.8, 0.9),
                (" the square.", pts + 0.8, pts + 1.4, 0.9),
            ]
            await sink.publish(
                caption_event(
                    stream_id, segment_id=f"s{seq}", words=words, language="en", model="tiny.en", captured_at=clock()
                )
            )
            next_speech += SPEECH_EVERY_S
        seq += 1
    mailbox.close()


# Servers other than vLLM >= 0.11, as the simulator models them (tests/support/vllm_sim.py).
OTHER_SERVERS: dict[str, dict[str, Any]] = {
    "data-URL-only server": {"images": "data"},
    "JSON in prose": {"answers": "prose"},
    "prose only": {"answers": "text"},
    "no cache_salt, no priority": {"refuse_fields": ("cache_salt", "priority")},
}


async def run_layout(
    name: str,
    frames: list[np.ndarray],
    args: argparse.Namespace,
    make_window: Callable[[DescribeSettings], Any],
    *,
    scene: str = "quiet",
    uuid_only: bool = True,
    server: dict[str, Any] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    clock = SimClock(args.speed)
    # busy: every frame differs enough to count as motion, so sampling runs at min_interval_s.
    motion = {"motion_threshold": 0.0} if scene == "busy" else {}
    settings = DescribeSettings(cache_salt="bench-tenant", timeout_s=60.0 / args.speed * 4, **motion, **overrides)
    async with VllmSimulator(
        latency_s=args.latency_s / args.speed,
        per_token_s=args.per_token_s / args.speed,
        limit_images=settings.max_frames,
        cache_blocks=1 << 20,
        **(server or {}),
    ) as sim:
        client = create_vlm_client(VlmSettings(endpoints=(sim.url,), model=sim.model, max_in_flight=64,
                                               uuid_only_images=1024 if uuid_only else 0))
        metered = MeteredClient(client, sim.model)
        engine = DescribeEngine(metered, sim.model, settings)  # type: ignore[arg-type]
        sinks, stages, tasks = [], [], []
        loop = asyncio.get_running_loop()
        for index in range(args.streams):
            stream_id = f"cam{index}"
            collected = Collected(clock)
            sink = ObservedSink(collected)
            mailbox = FrameMailbox(loop)
            stage = DescribeStage(stream_id, mailbox, engine, sink, rules=(CHECK,), wall=clock)
            stage.window = make_window(settings)
            sink.observers.append(stage.observe)
            sinks.append(collected)
            stages.append(stage)
            tasks.append(asyncio.create_task(stage.run()))
            tasks.append(
                asyncio.create_task(
                    feed(
                        stage,
                        mailbox,
                        sink,
                        frames,
                        stream=index,
                        clock=clock,
                        seconds=args.minutes * 60,
                        stream_id=stream_id,
                    )
                )
            )
        started = time.monotonic()
        await asyncio.gather(*tasks)
        wall_s = time.monotonic() - started
        stats = client.stats()
        await client.aclose()
    stream_minutes = args.streams * args.minutes
    prompt = sum(s.stats.prompt_tokens for s in stages)
    cached = sum(s.stats.cached_tokens for s in stages)
    lags = [lag for c in sinks for lag in c.lags]
    descriptions = sum(c.descriptions for c in sinks)
    return {
        "scene": scene,
        "layout": name,
        "max_frames": settings.max_frames,
        "reuse": round(cached / prompt, 3) if prompt else None,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefill_tokens_per_stream_min": round((prompt - cached) / stream_minutes),
        "lag_p50_s": pct(lags, 50),
        "lag_p99_s": pct(lags, 99),
        "descriptions_per_stream_min": round(descriptions / stream_minutes, 2),
        "requests_per_stream_min": round(metered.requests / stream_minutes, 2),
        "kib_per_stream_min": round(metered.bytes / 1024 / stream_minutes, 1),
        "checks": sum(s.stats.checks for s in stages),
        "failures": sum(s.stats.description_failures + s.stats.check_failures for s in stages),
        "uuid_refusals": stats.uuid_refusals,
        "fields_refused": stats.fields_refused,
        "answers": f"{stats.answers_json}/{stats.answers_extracted}/{stats.answers_text}",
        "epochs": sum(s.stats.epochs for s in stages),
        "frames_kept_per_stream_min": round(sum(s.stats.frames for s in stages) / stream_minutes, 1),
        "wall_s": round(wall_s, 1),
    }


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=10.0, help="simulated minutes per stream")
    parser.add_argument("--speed", type=float, default=4.0, help="simulated seconds per wall second")
    parser.add_argument(
        "--latency-s",
        type=float,
        default=0.35,
        help="simulated time to first token (queue + prefill of the uncached part)",
    )
    parser.add_argument("--per-token-s", type=float, default=0.015, help="simulated decode time per output token")
    parser.add_argument("--frames", type=int, default=400, help="frames of vtest.avi decoded and looped")
    parser.add_argument("--scenes", default="quiet,busy", help="quiet, busy or both (comma-separated)")
    args = parser.parse_args(argv)
    ensure_sample()
    frames = decode_frames(VTEST, args.frames)
    rows = []
    for scene in args.scenes.split(","):
        rows.append(await run_layout("append-only", frames, args, DescribeWindow, scene=scene))
        if scene == "busy":
            rows.append(await run_layout("append-only, 24-frame epochs", frames, args, DescribeWindow, scene=scene,
                                         max_frames=24))
            rows.append(await run_layout("append-only, data always", frames, args, DescribeWindow, scene=scene,
                                         uuid_only=False))
            for label, server in OTHER_SERVERS.items():
                rows.append(await run_layout(f"append-only, {label}", frames, args, DescribeWindow, scene=scene,
                                             server=server))
        if scene == "quiet":
            rows.append(await run_layout("naive", frames, args, NaiveWindow, scene=scene))
    columns = [
        "scene",
        "layout",
        "max_frames",
        "reuse",
        "prefill_tokens_per_stream_min",
        "lag_p50_s",
        "lag_p99_s",
        "descriptions_per_stream_min",
        "requests_per_stream_min",
        "kib_per_stream_min",
        "epochs",
        "failures",
        "uuid_refusals",
        "fields_refused",
        "answers",
        "wall_s",
    ]
    print(table(rows, columns))
    for row in rows:
        if row["layout"] == "append-only":
            ok = row["reuse"] is not None and row["reuse"] >= TARGET_REUSE
            print(f"{row['scene']}: append-only reuse {row['reuse']} (target >= {TARGET_REUSE}: "
                  f"{'met' if ok else 'MISSED'})")
    busy = {row["layout"]: row for row in rows if row["scene"] == "busy"}
    if "append-only" in busy:
        uuid = busy["append-only"]
        for label in OTHER_SERVERS:
            other = busy.get(f"append-only, {label}")
            if other is None:
                continue
            ok = other["descriptions_per_stream_min"] >= 0.95 * uuid["descriptions_per_stream_min"]
            print(f"busy, {label}: {other['descriptions_per_stream_min']} descriptions per stream-minute against "
                  f"{uuid['descriptions_per_stream_min']} from vLLM ({'as many' if ok else 'FEWER'}); reuse "
                  f"{other['reuse']}; {other['kib_per_stream_min']} KiB per stream-minute")
    prompts = ("system_prompt", "instruction", "check_instruction", "cache_salt")
    describe = {k: v for k, v in asdict(DescribeSettings()).items() if k not in prompts}
    path = write_results(
        "vlm",
        {
            "settings": {**vars(args), "describe": describe, "naive_frames": NAIVE_FRAMES},
            "target_reuse": TARGET_REUSE,
            "rows": rows,
        },
    )
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    asyncio.run(main())
