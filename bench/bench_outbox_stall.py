"""Disk outbox: how long its calls block the event loop (every stream's pipeline shares that loop).

A producer appends `--events` pre-encoded durable events (tracks, every 10th an alert) at
`--rate` events/s. The first `--outage` of them go in with nobody taking any out, as during a
broker outage: the outbox (bounded by `--max-bytes`) fills up and drops the oldest tracks around
the alerts it keeps, leaving sparse files to merge. Then a replay consumer leases the oldest
records and removes them a tick later, as acks would, at `--drain` times the append rate, until
it has emptied the outbox. On the way: segment rotation, fsync every fsync_interval_s (1 s, the
default), segment deletion, merges, acks-log rewrites, and at the end a reset.

Measured, on the loop that drives the outbox:
  loop lag      a probe task sleeping 1 ms records how late it wakes up (the stall any other
                coroutine sees); worst, p99 and p50 in ms, and how many wake-ups were > 2 ms late
  call time     the longest single append / take / remove / sync call, in ms
  cpu wait      how long the loop's thread was runnable but had no CPU (busy machine), and
  gc worst      the longest garbage-collector pause: stalls from those are not the outbox's doing
Cases, interleaved in one run: the probe on an idle loop (the machine's noise floor); the outbox
with its file work inline on the loop (how it ran before background I/O); with background I/O
(`start_background_io()`, as the publisher runs it: fsync, merges and acks-log rewrites on a
worker thread); and background I/O with fsync_interval_s=None (no fsync at all).

With `--compare-with FILE` another version of outbox.py is measured too, in the same run, and
the ratios are to it; e.g. the one before background I/O:
  git show c038f0d:realtime/bus/outbox.py > /tmp/outbox_before.py

Usage: python bench/bench_outbox_stall.py [--events 40000] [--rate 10000] [--repeat 3] [--compare-with FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, pct, table, write_results
from bench_publisher import track_event

from pipelines.events import EventKind
from realtime.bus.cloudevents import encode, subject_for
from realtime.bus.delivery import WireMessage
from realtime.bus.outbox import Outbox

_SEVERITIES = ("info", "warning", "critical")
_PROBE_S = 0.001


def messages(n: int) -> list[WireMessage]:
    out = []
    for i in range(n):
        ev = track_event(i, f"cam{i % 4}")
        payload, headers = encode(ev, "bench", time.time())
        kind, severity = (EventKind.ALERTS, _SEVERITIES[i // 10 % 3]) if i % 10 == 0 else (EventKind.TRACKS, None)
        out.append(WireMessage(ev.id, kind, subject_for(ev), payload, headers, time.monotonic(), severity))
    return out


class LoopProbe:
    """Sleeps `_PROBE_S` again and again and records how much later than asked it wakes up."""

    def __init__(self) -> None:
        self.lags_ms: list[float] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            start = time.perf_counter()
            await asyncio.sleep(_PROBE_S)
            self.lags_ms.append(max(0.0, (time.perf_counter() - start - _PROBE_S) * 1000))


def runqueue_wait_ms() -> float | None:
    """How long this thread has been runnable but not running (other processes had the CPUs):
    stalls from that are the machine's, not the outbox's. Linux only."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return None


class GcPauses:
    """The longest garbage-collector pause while in use (a stall that is nobody's I/O)."""

    def __init__(self) -> None:
        self.worst_ms = 0.0
        self._started = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.worst_ms = max(self.worst_ms, (time.perf_counter() - self._started) * 1000)


class CallTimes:
    """The longest single call per outbox method."""

    def __init__(self) -> None:
        self.worst_ms: dict[str, float] = {}

    def timed(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            ms = (time.perf_counter() - start) * 1000
            if ms > self.worst_ms.get(name, 0.0):
                self.worst_ms[name] = ms


async def idle_round(seconds: float) -> dict[str, Any]:
    probe, stop = LoopProbe(), asyncio.Event()
    task = asyncio.create_task(probe.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    await task
    return {"lags_ms": probe.lags_ms, "calls": {}}


async def outbox_round(
    outbox_cls: type[Outbox],
    directory: Path,
    msgs: list[WireMessage],
    args: argparse.Namespace,
    *,
    fsync: float | None,
    background: bool,
) -> dict[str, Any]:
    outbox = outbox_cls(directory, max_bytes=args.max_bytes, fsync_interval_s=fsync)
    if background:
        outbox.start_background_io()
    calls = CallTimes()
    probe, stop = LoopProbe(), asyncio.Event()
    produced, outage_over = asyncio.Event(), asyncio.Event()
    outage_events = int(len(msgs) * args.outage)
    per_tick = args.batch
    tick_s = per_tick / args.rate
    drain_per_tick = max(1, round(per_tick * args.drain))

    async def produce() -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        for start in range(0, len(msgs), per_tick):
            for msg in msgs[start : start + per_tick]:
                calls.timed("append", outbox.append, msg)
            if start >= outage_events:
                outage_over.set()
            due += tick_s
            await asyncio.sleep(max(0.0, due - loop.time()))
        outage_over.set()
        produced.set()

    async def replay() -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        leased: list[int] = []
        await outage_over.wait()
        due = loop.time()
        while not (produced.is_set() and outbox.depth == 0):
            for seq in leased:  # acked since the last tick
                calls.timed("remove", outbox.remove, seq)
            leased = [r.seq for r in calls.timed("take", outbox.take, drain_per_tick)]
            due += tick_s
            await asyncio.sleep(max(0.0, due - loop.time()))

    async def fsync_ticker() -> None:  # the publisher's idle-time sync (_wait_for_work)
        while not stop.is_set():
            await asyncio.sleep(fsync or 1.0)
            if outbox.needs_sync:
                calls.timed("sync", outbox.sync)

    probe_task = asyncio.create_task(probe.run(stop))
    ticker = asyncio.create_task(fsync_ticker())
    start = time.perf_counter()
    waited_before = runqueue_wait_ms()
    try:
        with GcPauses() as gc_pauses:
            await asyncio.gather(produce(), replay())
        elapsed = time.perf_counter() - start
        waited_after = runqueue_wait_ms()
    finally:
        stop.set()
        await asyncio.gather(probe_task, ticker)
        if background:  # as the publisher closes it: the last fsync off the loop, then close()
            calls.timed("sync", outbox.sync)
            await asyncio.to_thread(outbox.wait_for_background_io)
        stats = outbox.stats()
        calls.timed("close", outbox.close)
    return {
        "lags_ms": probe.lags_ms,
        "calls": calls.worst_ms,
        "elapsed_s": elapsed,
        "gc_worst_ms": gc_pauses.worst_ms,
        "cpu_wait_ms": None if waited_before is None or waited_after is None else waited_after - waited_before,
        "dropped_overflow": sum(stats.dropped_overflow.values()),
        "removed": stats.removed,
        "write_errors": stats.write_errors,
    }


def summary(case: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return float(statistics.median(present)) if present else None

    row: dict[str, Any] = {
        "case": case,
        "lag worst ms": med([max(r["lags_ms"], default=None) for r in rounds]),
        "lag p99 ms": med([pct(r["lags_ms"], 99) for r in rounds]),
        "lag p50 ms": med([pct(r["lags_ms"], 50) for r in rounds]),
        "lags > 2 ms": med([sum(lag > 2.0 for lag in r["lags_ms"]) for r in rounds]),
    }
    for name in ("append", "take", "remove", "sync", "close"):
        row[f"{name} max ms"] = med([r["calls"].get(name) for r in rounds])
    if "dropped_overflow" in rounds[0]:
        row["dropped"] = med([r["dropped_overflow"] for r in rounds])
        row["s"] = med([r["elapsed_s"] for r in rounds])
        row["cpu wait ms"] = med([r["cpu_wait_ms"] for r in rounds])
        row["gc worst ms"] = med([r["gc_worst_ms"] for r in rounds])
    return row


def load_outbox_class(path: Path) -> type[Outbox]:
    """`Outbox` from another version of outbox.py (e.g. `git show REV:realtime/bus/outbox.py`)."""
    spec = importlib.util.spec_from_file_location(f"compared_outbox_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    outbox_cls: type[Outbox] = module.Outbox
    return outbox_cls


async def run(args: argparse.Namespace) -> dict[str, Any]:
    msgs = messages(args.events)
    gc.freeze()  # the pre-encoded messages are scaffolding: keep them out of the collector's way
    seconds = args.events / args.rate
    idle = "idle loop (noise floor)"
    cases: dict[str, tuple[type[Outbox], float | None, bool]] = {}  # name: class, fsync_interval_s, background
    if args.compare_with:
        cases[f"{args.compare_with.name}, inline, fsync 1 s"] = (load_outbox_class(args.compare_with), 1.0, False)
    cases["inline, fsync 1 s"] = (Outbox, 1.0, False)
    cases["background I/O, fsync 1 s"] = (Outbox, 1.0, True)
    cases["background I/O, no fsync"] = (Outbox, None, True)
    rounds: dict[str, list[dict[str, Any]]] = {idle: [], **{case: [] for case in cases}}
    args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        for i in range(args.repeat):  # interleaved, so all cases see the same machine
            rounds[idle].append(await idle_round(min(seconds, 3.0)))
            for n, (case, (cls, fsync, background)) in enumerate(cases.items()):
                directory = root / f"case{n}-{i}"
                rounds[case].append(await outbox_round(cls, directory, msgs, args, fsync=fsync, background=background))
    rows = [summary(case, results) for case, results in rounds.items()]
    reference = rows[1]  # the first outbox case: the compared version, else inline
    for row in rows[1:]:
        for key in ("lag worst ms", "lag p99 ms"):
            if reference[key] and row[key] is not None:
                row[f"{key.removesuffix(' ms')} vs ref"] = row[key] / reference[key]
    columns = ["case", "lag worst ms", "lag p99 ms", "lag p50 ms", "lags > 2 ms", "lag worst vs ref", "lag p99 vs ref"]
    columns += ["append max ms", "take max ms", "remove max ms", "sync max ms", "close max ms", "dropped", "s"]
    columns += ["cpu wait ms", "gc worst ms"]
    print(table(rows, columns))
    print(
        f"median of {args.repeat} rounds; {args.events} appends at {args.rate:g}/s in batches of {args.batch}, "
        f"replay after {args.outage:.0%} of them at {args.drain:g}x that rate, max_bytes={args.max_bytes}; "
        f"probe sleeps {_PROBE_S * 1000:g} ms; ref = {reference['case']}"
    )

    def strip(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "lags_ms"} | {"probes": len(r["lags_ms"])} for r in rounds]

    return {
        "params": vars(args) | {"dir": str(args.dir), "compare_with": args.compare_with and str(args.compare_with)},
        "rows": rows,
        "rounds": {case: strip(results) for case, results in rounds.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=40_000, help="appends per round")
    parser.add_argument("--rate", type=float, default=10_000, help="appends per second")
    parser.add_argument("--batch", type=int, default=10, help="appends per producer tick")
    parser.add_argument("--outage", type=float, default=0.5, help="fraction of the appends made before replay starts")
    parser.add_argument("--drain", type=float, default=1.5, help="replay rate as a multiple of --rate")
    parser.add_argument("--max-bytes", type=int, default=2 * 2**20, help="outbox max_bytes (segments are 1/4)")
    parser.add_argument(
        "--compare-with", type=Path, default=None, help="another outbox.py to measure (inline) in the same run"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the table shows medians")
    parser.add_argument("--dir", type=Path, default=ROOT / ".cache", help="a real disk, not tmpfs")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(f"wrote {write_results('outbox_stall', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
