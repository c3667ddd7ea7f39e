"""Browser sessions over WebRTC: overlay lag, and how many sessions stay real-time.

Both parts run the real service in this process (embedded nats-server, the shared detector
on ONNX Runtime CPU with the service's default thread count) and in-process aiortc peers
from tests/support/peer.py, each sending 640x480 vtest frames at 15 fps (video only).

  lag       One session per model (the default people model, then 320n). Over --lag-seconds:
            `lag_ms` of the `detections` messages the peer receives — server side, from the
            frame leaving aiortc's receive queue to the message handed to the DataChannel —
            p50 / p99; frames received / processed / dropped; the bare model's per-frame
            `detect()` time measured just before on the same frames, and the model time
            inside the pipeline for comparison.

  sessions  320n. Sessions are added one at a time up to --max-sessions; after each one
            settles, over --seconds: per session, processed fps (of 15), frames dropped
            (latest-frame-wins: `frames_dropped` + `webrtc_video_stale`, plus
            `webrtc_video_over_rate`: frames that came in a burst faster than
            webrtc.max_fps, 30, after a stall; `over_rate` alone in the JSON), lag p50, and lag
            growth across the window (second half p50 - first half p50 of `lag_ms`, and the
            same for end-to-end offset: arrival at the peer - frame pts, which also catches
            lag building up before the service, e.g. in the network or a slow sender).
            Real-time: every session processes >= 95 % of the frames it receives and >= 95 %
            of 15 fps, and neither lag grows by more than the GROWTH limits. The ramp goes
            --past counts beyond the first count that is not real-time, to show the trend.

            CPU per session outside the model: this process's CPU time over the window
            (every thread) minus the model's (the batcher's inference thread plus ONNX
            Runtime's own pool threads, per-thread CPU from /proc/self/task) minus the
            peers' own (VP8 encode, packetising, SRTP). The peers' share is measured in a
            second ramp with the same peers sending to a bare aiortc receiver in a
            subprocess that only drains its tracks, so this process then runs the peers
            alone. What remains is the service's decode (aiortc's decoder threads),
            conversion, tracking, publishing and DataChannel work. The nats-server
            (a separate process) is reported on its own.

The machine may be shared: each window starts once other processes use little CPU, and is
measured again (up to twice) if they loaded it meanwhile, within --patience seconds for the
whole run; every row reports `others_core_pct`, other processes' CPU during its window.

Usage: python bench/bench_webrtc.py [--parts lag,sessions] [--lag-seconds 20] [--seconds 10]
                                    [--max-sessions 8] [--past 1] [--models default,320n]
                                    [--patience 90]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import numpy as np
from _common import ROOT, pct, peak_rss_mb, table, write_results
from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from tests.support.peer import Peer, connect, load_frames

# The service stack is imported inside the functions that use it: the bare receiver (this file
# run with --drain-server, in a subprocess) needs aiortc alone.
if TYPE_CHECKING:
    from engines.detector import Detector
    from realtime.bus.embedded import EmbeddedNatsServer
    from tests.support.service import LiveService

MODELS = ("default", "320n")
FPS = 15.0
SIZE = (640, 480)
SETTLE_S = 3.0  # after a session's first processed frame, before its window opens
REALTIME_SHARE = 0.95
GROWTH_LAG_MS = 25.0  # server-side lag_ms, second half p50 over first half p50
GROWTH_E2E_MS = 100.0  # arrival - pts at the peer; wider: it includes the jitter buffer
# Other processes share this machine: a window during which they took more than this share of
# a core is measured again, up to WINDOW_ATTEMPTS in all; the last is kept (others_core_pct says).
CONTENDED_PCT = 25.0
WINDOW_ATTEMPTS = 3
QUIET_WAIT_MAX_S = 20.0  # before one window
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- CPU accounting -----------------------------------------------------------------------------


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each live thread of this process, by thread id."""
    out: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu() -> float:
    """Busy CPU seconds of the whole machine, summed over its cores."""
    with open("/proc/stat") as fh:
        ticks = [int(v) for v in fh.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK  # all but idle and iowait


def native_threads() -> set[int]:
    """Threads Python did not start (ONNX Runtime's pool, codec threads)."""
    python = {t.native_id for t in threading.enumerate()}
    return {tid for tid in thread_cpu() if tid not in python}


def model_threads(ort_pool: set[int]) -> set[int]:
    infer = {t.native_id for t in threading.enumerate() if t.name.startswith("vidsentry-infer")}
    return {tid for tid in infer if tid is not None} | ort_pool


def decoder_threads() -> set[int]:
    return {t.native_id for t in threading.enumerate() if t.name.endswith("-decoder") and t.native_id}


@dataclass
class CpuWindow:
    """CPU over a window: this process (all threads, and groups of them), one child process
    of ours (nats-server, or the bare receiver), and the whole machine."""

    child_pid: int | None
    started: float = 0.0
    process: float = 0.0
    threads: dict[int, float] = field(default_factory=dict)
    child: float = 0.0
    machine: float = 0.0

    def open(self) -> None:
        self.started = time.perf_counter()
        self.process = time.process_time()
        self.threads = thread_cpu()
        self.child = process_cpu(self.child_pid) if self.child_pid else 0.0
        self.machine = machine_cpu()

    def close(self, groups: dict[str, set[int]]) -> dict[str, float]:
        """Seconds of wall time and of CPU: this process, each group of its threads, the child."""
        threads = thread_cpu()
        out = {"wall_s": time.perf_counter() - self.started, "process_s": time.process_time() - self.process}
        for name, tids in groups.items():
            out[f"{name}_s"] = sum(threads.get(t, 0.0) - self.threads.get(t, 0.0) for t in tids)
        out["child_s"] = (process_cpu(self.child_pid) - self.child) if self.child_pid else 0.0
        # The whole machine's busy core-seconds: on a shared machine other processes decide
        # how much of the cores this run could have.
        out["machine_s"] = machine_cpu() - self.machine
        return out


@dataclass
class Patience:
    """Seconds the whole run may spend waiting for other processes to quiet down or measuring
    windows again because they did not: a busy machine makes the run at most this much longer."""

    left_s: float

    def spend(self, seconds: float) -> None:
        self.left_s = max(0.0, self.left_s - seconds)


async def quiet(child_pid: int | None, patience: Patience, *, limit_pct: float = 30.0) -> float:
    """Wait, within patience and QUIET_WAIT_MAX_S, until other processes use under `limit_pct`
    of a core: the machine is shared, and a window measured beside someone's test run measures
    their load. Returns the seconds waited."""
    started = time.monotonic()
    within_s = min(QUIET_WAIT_MAX_S, patience.left_s)
    while time.monotonic() - started < within_s:
        cpu = CpuWindow(child_pid)
        cpu.open()
        await asyncio.sleep(1.0)
        used = cpu.close({})
        if 100 * (used["machine_s"] - used["process_s"] - used["child_s"]) / used["wall_s"] < limit_pct:
            break
    waited = time.monotonic() - started
    patience.spend(waited)
    return round(waited, 1)


# -- the peers' side of each session ------------------------------------------------------------


@dataclass
class Session:
    """One in-process peer and what its DataChannel brings back, per detections message:
    arrival (monotonic), the server's lag_ms, and arrival (epoch) - pts."""

    peer: Peer
    records: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def stream_id(self) -> str:
        return self.peer.stream_id

    def listen(self) -> None:
        # Replaces peer.py's collector, which keeps every message: a ramp runs for minutes.
        self.peer.channel.remove_all_listeners("message")
        self.peer.channel.on("message", self._on_message)

    def _on_message(self, text: str) -> None:
        message = json.loads(text)
        if message.get("kind") == "detections":
            now = time.time()
            pts = message["body"].get("pts") or 0.0
            self.records.append((time.monotonic(), float(message["lag_ms"]), now - pts))


async def open_session(http: aiohttp.ClientSession, url: str, frames: list[np.ndarray]) -> Session:
    session = Session(await connect(http, url, frames=frames, fps=FPS))
    session.listen()
    return session


def halves_growth(values: list[float]) -> float | None:
    """p50 of the second half minus p50 of the first: positive when lag builds up."""
    if len(values) < 8:
        return None
    mid = len(values) // 2
    return round(float(np.median(values[mid:]) - np.median(values[:mid])), 1)


# -- the service side ---------------------------------------------------------------------------


async def counters(svc: LiveService, stream_id: str) -> dict[str, float]:
    body = await svc.stream(stream_id)
    return dict(body["counters"])


def received(c: dict[str, float]) -> float:
    # Every frame aiortc handed over: converted (frames_in) or skipped unconverted.
    return c.get("frames_in", 0) + c.get("webrtc_video_stale", 0) + c.get("webrtc_video_over_rate", 0)


def session_row(
    before: dict[str, float], after: dict[str, float], wall_s: float, s: Session, span: tuple[float, float]
) -> dict[str, Any]:
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    got = received(after) - received(before)
    window = [r for r in s.records if span[0] <= r[0] <= span[1]]  # by arrival at the peer
    lags = [r[1] for r in window]
    e2e = [r[2] * 1000 for r in window]
    return {
        "received": int(got),
        "processed": int(delta["frames_processed"]),
        "dropped": int(delta["frames_dropped"] + delta["webrtc_video_stale"] + delta["webrtc_video_over_rate"]),
        "over_rate": int(delta["webrtc_video_over_rate"]),
        "received_fps": round(got / wall_s, 2),
        "processed_fps": round(delta["frames_processed"] / wall_s, 2),
        "processed_share": round(delta["frames_processed"] / got, 3) if got else 0.0,
        "lag_p50_ms": pct(lags, 50),
        "lag_p99_ms": pct(lags, 99),
        "lag_growth_ms": halves_growth(lags),
        "e2e_growth_ms": halves_growth(e2e),
        "messages": len(window),
    }


def is_realtime(row: dict[str, Any]) -> bool:
    return (
        row["processed_share"] >= REALTIME_SHARE
        and row["processed_fps"] >= REALTIME_SHARE * FPS
        and (row["lag_growth_ms"] or 0.0) <= GROWTH_LAG_MS
        and (row["e2e_growth_ms"] or 0.0) <= GROWTH_E2E_MS
    )


@contextlib.asynccontextmanager
async def service(detector: Detector, nats_url: str, sessions: int) -> AsyncIterator[LiveService]:
    from tests.support.service import live_service, make_config

    config = make_config(
        node="bench",
        http={"max_streams": max(64, sessions)},
        webrtc={"max_sessions": sessions, "inactivity_timeout_s": 10.0},
    )
    async with live_service(detector, nats_url, config=config) as svc:
        yield svc


def open_detector(model: str) -> Detector:
    """ONNX Runtime on the CPU with the service's default thread count (one per core)."""
    from engines.models import fall_model_path, nudenet_model_path
    from engines.registry import create_detector

    path = fall_model_path() if model == "default" else nudenet_model_path()
    return create_detector(path, "onnx-cpu")


async def wait_processing(svc: LiveService, s: Session) -> None:
    await svc.wait_for_state(s.stream_id, "live", within_s=30, min_processed=1)


def bare_detect_ms(detector: Detector, frames: list[np.ndarray], budget_s: float) -> list[float]:
    """The model alone on the same frames, one frame per call as one session's loop does."""
    for frame in frames[:2]:
        detector.detect([frame])
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - started < budget_s and len(times) < 200):
        t = time.perf_counter()
        detector.detect([frames[len(times) % len(frames)]])
        times.append((time.perf_counter() - t) * 1000)
    return times


@dataclass
class Window:
    """One measurement window over some sessions: their counters before and after, CPU."""

    before: list[dict[str, float]]
    after: list[dict[str, float]]
    used: dict[str, float]
    span: tuple[float, float]  # monotonic
    batcher_busy_s: float
    waited_s: float
    attempts: int

    @property
    def others_core_pct(self) -> float:
        used = self.used
        return round(100 * (used["machine_s"] - used["process_s"] - used["child_s"]) / used["wall_s"], 1)

    def rows(self, sessions: list[Session]) -> list[dict[str, Any]]:
        pairs = zip(sessions, self.before, self.after, strict=True)
        return [session_row(b, a, self.used["wall_s"], s, self.span) for s, b, a in pairs]


async def measure(
    svc: LiveService,
    sessions: list[Session],
    seconds: float,
    nats_pid: int | None,
    *,
    patience: Patience,
    groups: Callable[[], dict[str, set[int]]] = dict,
) -> Window:
    """A window after the machine is quiet; measured again if others loaded it meanwhile."""
    waited = 0.0
    for attempt in range(1, WINDOW_ATTEMPTS + 1):
        waited += await quiet(nats_pid, patience)
        cpu = CpuWindow(nats_pid)
        before = [await counters(svc, s.stream_id) for s in sessions]
        busy = svc.service.batcher.stats.busy_s
        t0 = time.monotonic()
        cpu.open()
        await asyncio.sleep(seconds)
        used = cpu.close(groups())
        span = (t0, time.monotonic())
        after = [await counters(svc, s.stream_id) for s in sessions]
        window = Window(before, after, used, span, svc.service.batcher.stats.busy_s - busy, waited, attempt)
        if window.others_core_pct <= CONTENDED_PCT or patience.left_s < seconds:
            break
        patience.spend(seconds)
    return window


# -- part 1: overlay lag ------------------------------------------------------------------------


async def lag_part(
    args: argparse.Namespace, frames: list[np.ndarray], nats: EmbeddedNatsServer
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for model in args.models:
        detector = open_detector(model)
        try:
            bare = bare_detect_ms(detector, frames, budget_s=3.0)
            async with service(detector, nats.url, 1) as svc:
                s = await open_session(svc.session, svc.url, frames)
                try:
                    await wait_processing(svc, s)
                    await asyncio.sleep(SETTLE_S)
                    window = await measure(svc, [s], args.lag_seconds, nats.pid, patience=args.patience)
                    runner = svc.service.registry.runner(s.stream_id)
                    assert runner is not None and runner.frame_loop is not None
                    in_loop = list(runner.frame_loop.stats.inference_ms)
                finally:
                    await s.peer.close()
            r = window.rows([s])[0]
            row = {
                "model": model,
                "seconds": round(window.used["wall_s"], 1),
                "lag_p50_ms": r["lag_p50_ms"],
                "lag_p99_ms": r["lag_p99_ms"],
                "bare_model_p50_ms": pct(bare, 50),
                "model_in_loop_p50_ms": pct(in_loop[-max(1, r["processed"]) :], 50),
                "received": r["received"],
                "processed": r["processed"],
                "dropped": r["dropped"],
                "processed_fps": r["processed_fps"],
                "others_core_pct": window.others_core_pct,
                "waited_for_quiet_s": window.waited_s,
                "attempts": window.attempts,
            }
            rows.append(row)
            print(table([row], list(row)), flush=True)
        finally:
            detector.close()
    return rows


# -- part 2: sessions that stay real-time ---------------------------------------------------------


async def sessions_part(
    args: argparse.Namespace, frames: list[np.ndarray], nats: EmbeddedNatsServer
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from tests.support.service import wait_until

    natives = native_threads()  # numpy's and OpenCV's pools: not the model's
    detector = open_detector("320n")  # starts ONNX Runtime's pool threads
    rows: list[dict[str, Any]] = []
    per_session: list[dict[str, Any]] = []
    try:
        bare_detect_ms(detector, frames, budget_s=1.0)
        ort_pool = native_threads() - natives
        async with service(detector, nats.url, args.max_sessions) as svc:
            sessions: list[Session] = []
            failed = 0
            try:
                for n in range(1, args.max_sessions + 1):
                    sessions.append(await open_session(svc.session, svc.url, frames))
                    await wait_processing(svc, sessions[-1])
                    await asyncio.sleep(SETTLE_S)
                    window = await measure(
                        svc,
                        sessions,
                        args.seconds,
                        nats.pid,
                        patience=args.patience,
                        groups=lambda: {"model": model_threads(ort_pool), "decode": decoder_threads()},
                    )
                    each = [{"sessions": n, "session": i + 1, **r} for i, r in enumerate(window.rows(sessions))]
                    per_session += each
                    row = ramp_row(n, each, window)
                    rows.append(row)
                    print(table([row], list(row)), flush=True)
                    for s in sessions:  # only the current window's records are needed
                        s.records.clear()
                    failed += not row["realtime"]
                    if failed > args.past:
                        break
            finally:
                await asyncio.gather(*(s.peer.close() for s in sessions), return_exceptions=True)
                await wait_until(lambda: svc.service.sessions.count == 0, 15, "sessions to end")
    finally:
        detector.close()
    return rows, per_session


def ramp_row(n: int, each: list[dict[str, Any]], window: Window) -> dict[str, Any]:
    used, wall = window.used, window.used["wall_s"]
    lags = [e["lag_p50_ms"] for e in each if e["lag_p50_ms"] is not None]
    return {
        "sessions": n,
        "min_fps": min(e["processed_fps"] for e in each),
        "mean_fps": round(float(np.mean([e["processed_fps"] for e in each])), 2),
        "min_share": min(e["processed_share"] for e in each),
        "dropped": sum(e["dropped"] for e in each),
        "lag_p50_ms": round(float(np.median(lags)), 1) if lags else None,
        "worst_lag_p50_ms": max(lags) if lags else None,
        "max_lag_growth_ms": max((e["lag_growth_ms"] or 0.0) for e in each),
        "max_e2e_growth_ms": max((e["e2e_growth_ms"] or 0.0) for e in each),
        "realtime": all(is_realtime(e) for e in each),
        "process_core_pct": round(100 * used["process_s"] / wall, 1),
        "model_core_pct": round(100 * used["model_s"] / wall, 1),
        "model_busy_pct": round(100 * window.batcher_busy_s / wall, 1),
        "decode_core_pct": round(100 * used["decode_s"] / wall, 1),
        "nats_core_pct": round(100 * used["child_s"] / wall, 1),
        "others_core_pct": window.others_core_pct,
        "wall_s": round(wall, 2),
        "waited_for_quiet_s": window.waited_s,
        "attempts": window.attempts,
    }


# -- the peers alone: a bare receiver in a subprocess ----------------------------------------------


async def _drain(track: MediaStreamTrack) -> None:
    with contextlib.suppress(MediaStreamError):
        while True:
            await track.recv()


async def drain_server() -> None:
    """Answers offers at /api/webrtc/offer and drains every track; ends when stdin closes."""
    pcs: list[RTCPeerConnection] = []
    tasks: set[asyncio.Task[None]] = set()

    def on_track(track: MediaStreamTrack) -> None:
        task = asyncio.create_task(_drain(track))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def offer(request: web.Request) -> web.Response:
        body = await request.json()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pcs.append(pc)
        pc.on("track", on_track)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        answer = {"sdp": pc.localDescription.sdp, "type": "answer", "stream_id": f"drain-{len(pcs)}"}
        return web.json_response(answer, status=201)

    app = web.Application()
    app.router.add_post("/api/webrtc/offer", offer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    print(server.sockets[0].getsockname()[1], flush=True)
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        await asyncio.gather(*(pc.close() for pc in pcs), return_exceptions=True)
        await runner.cleanup()


@contextlib.contextmanager
def drain_process() -> Iterator[tuple[str, int]]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--drain-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # its signal to close its peer connections and exit
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sent_frames(peer: Peer) -> int:
    return peer.video.sent if peer.video is not None else 0


async def peers_part(args: argparse.Namespace, frames: list[np.ndarray], counts: int) -> list[dict[str, Any]]:
    """The same peers, the same ramp, to a receiver elsewhere: this process's CPU is theirs."""
    from tests.support.service import wait_until

    rows: list[dict[str, Any]] = []
    seconds = min(args.seconds, 8.0)
    with drain_process() as (url, receiver_pid):
        async with aiohttp.ClientSession() as http:
            peers: list[Peer] = []
            try:
                for n in range(1, counts + 1):
                    peer = await connect(http, url, frames=frames, fps=FPS)
                    peers.append(peer)
                    await wait_until(lambda: sent_frames(peers[-1]) > 0, 15, "the peer to send")
                    await asyncio.sleep(SETTLE_S)
                    waited = await quiet(receiver_pid, args.patience)
                    sent = [sent_frames(p) for p in peers]
                    cpu = CpuWindow(receiver_pid)
                    cpu.open()
                    await asyncio.sleep(seconds)
                    used = cpu.close({})
                    fps = [(sent_frames(p) - b) / used["wall_s"] for p, b in zip(peers, sent, strict=True)]
                    row = {
                        "peers": n,
                        "peer_core_pct": round(100 * used["process_s"] / used["wall_s"], 1),
                        "per_peer_core_pct": round(100 * used["process_s"] / used["wall_s"] / n, 1),
                        "min_sent_fps": round(min(fps), 2),
                        "receiver_core_pct": round(100 * used["child_s"] / used["wall_s"], 1),
                        "others_core_pct": round(
                            100 * (used["machine_s"] - used["process_s"] - used["child_s"]) / used["wall_s"], 1
                        ),
                        "waited_for_quiet_s": waited,
                        "wall_s": round(used["wall_s"], 2),
                    }
                    rows.append(row)
                    print(table([row], list(row)), flush=True)
            finally:
                await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)
    return rows


def server_cpu(ramp: list[dict[str, Any]], peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per count: % of one core per session spent by the service outside the model."""
    alone = {p["peers"]: p for p in peers}
    out = []
    for row in ramp:
        n = row["sessions"]
        peer = alone.get(n)
        if peer is None:
            continue
        outside = row["process_core_pct"] - row["model_core_pct"] - peer["peer_core_pct"]
        out.append(
            {
                "sessions": n,
                "process_core_pct": row["process_core_pct"],
                "model_core_pct": row["model_core_pct"],
                "peers_core_pct": peer["peer_core_pct"],
                "outside_model_core_pct": round(outside, 1),
                "outside_model_per_session_pct": round(outside / n, 1),
                "decode_per_session_pct": round(row["decode_core_pct"] / n, 1),
                "rest_per_session_pct": round((outside - row["decode_core_pct"]) / n, 1),
                # Past real-time the cores are saturated and everyone gets less than they need:
                # a difference of separately measured shares then says little.
                "realtime": row["realtime"],
            }
        )
    return out


# -- main -----------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "samples"))
    import make_sample

    samples = ROOT / ".cache" / "samples"
    if not (samples / "vtest.avi").exists():
        make_sample.main(["--out", str(samples)])
    frames = load_frames(samples / "vtest.avi", count=60, size=SIZE)
    result: dict[str, Any] = {
        "fps": FPS,
        "size": list(SIZE),
        "loadavg_before": os.getloadavg(),
        "realtime_rule": {
            "processed_share_min": REALTIME_SHARE,
            "processed_fps_min": REALTIME_SHARE * FPS,
            "lag_growth_max_ms": GROWTH_LAG_MS,
            "e2e_growth_max_ms": GROWTH_E2E_MS,
        },
    }
    from realtime.bus.embedded import EmbeddedNatsServer

    with tempfile.TemporaryDirectory() as store, EmbeddedNatsServer(store_dir=Path(store)) as nats:
        if "lag" in args.parts:
            print(f"overlay lag, 1 session, {args.lag_seconds:g} s per model", flush=True)
            result["lag"] = await lag_part(args, frames, nats)
        if "sessions" in args.parts:
            print(f"\nsessions ramp, 320n, {args.seconds:g} s per count", flush=True)
            ramp, each = await sessions_part(args, frames, nats)
            result["sessions"] = ramp
            result["per_session"] = each
    if "sessions" in args.parts:
        print("\npeers alone (bare receiver in a subprocess)", flush=True)
        result["peers_alone"] = await peers_part(args, frames, len(result["sessions"]))
        result["server_cpu"] = server_cpu(result["sessions"], result["peers_alone"])
        fine_rows = [r["outside_model_per_session_pct"] for r in result["server_cpu"] if r["realtime"]]
        result["outside_model_per_session_pct"] = round(float(np.mean(fine_rows)), 1) if fine_rows else None
        # The largest count such that it and every smaller count stayed real-time.
        fine = 0
        while fine < len(result["sessions"]) and result["sessions"][fine]["realtime"]:
            fine += 1
        result["max_realtime_sessions"] = fine
    result["loadavg_after"] = os.getloadavg()
    result["patience_s"] = {"given": args.patience_s, "left": round(args.patience.left_s, 1)}
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    report(result)
    return result


def report(result: dict[str, Any]) -> None:
    if "lag" in result:
        print("\noverlay lag, server side (frame out of aiortc -> detections handed to the DataChannel), 1 session")
        print(table(result["lag"], list(result["lag"][0])))
    if "sessions" in result:
        columns = [
            "sessions",
            "min_fps",
            "mean_fps",
            "min_share",
            "dropped",
            "lag_p50_ms",
            "worst_lag_p50_ms",
            "max_lag_growth_ms",
            "max_e2e_growth_ms",
            "realtime",
            "others_core_pct",
        ]
        print(f"\nsessions, 320n, 640x480 at {FPS:g} fps each (fps = processed per session;")
        print(" others_core_pct = CPU of other processes on this shared machine during the window)")
        print(table(result["sessions"], columns))
        print(f"largest count that stays real-time: {result['max_realtime_sessions']}")
        print("\nCPU, % of one core (service outside the model = process - model threads - peers alone)")
        print(table(result["server_cpu"], list(result["server_cpu"][0])))
        print(
            "service CPU outside the model, per session (mean over real-time counts): "
            f"{result['outside_model_per_session_pct']} % of one core"
        )
        nats = ", ".join(f"{r['sessions']}: {r['nats_core_pct']}" for r in result["sessions"])
        print(f"nats-server (own process), % core by sessions: {nats}")
    print(
        f"loadavg before {result['loadavg_before']}, after {result['loadavg_after']}; patience {result['patience_s']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="lag,sessions", help="comma-separated: lag, sessions")
    parser.add_argument("--lag-seconds", type=float, default=20.0, help="lag window per model")
    parser.add_argument("--seconds", type=float, default=10.0, help="window per session count")
    parser.add_argument("--max-sessions", type=int, default=8)
    parser.add_argument("--patience", type=float, default=90.0, help="seconds in all to wait out other load")
    parser.add_argument("--past", type=int, default=1, help="counts measured past the first not real-time")
    parser.add_argument("--models", default="default,320n", help="for the lag part: default, 320n")
    parser.add_argument("--drain-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drain_server:
        asyncio.run(drain_server())
        return
    args.parts = set(args.parts.split(","))
    args.models = args.models.split(",")
    args.patience_s, args.patience = args.patience, Patience(args.patience)
    if unknown := set(args.models) - set(MODELS):
        parser.error(f"unknown models {sorted(unknown)}; choose from {', '.join(MODELS)}")
    result = asyncio.run(main_async(args))
    print(f"\nwrote {write_results('webrtc', result)}")


if __name__ == "__main__":
    main()
