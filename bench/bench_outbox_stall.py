"""Disk outbox: how long its calls block the event loop (every stream's pipeline shares that loop).

A producer appends `--events` pre-encoded durable events (tracks, every 10th an alert) at
`--rate` events/s while a replay consumer leases the oldest records and removes them a tick
later, as acks would, at `--drain` of that rate. The outbox is bounded (`--max-bytes`), so it
fills up, drops the oldest tracks around the alerts it keeps, and has to compact: segment
rotation, fsync every fsync_interval_s (1 s, the default), segment deletion and merges, acks-log
rewrites, and at the end a reset when the consumer has drained it.

Measured, on the loop that drives the outbox:
  loop lag      a probe task sleeping 1 ms records how late it wakes up (the stall any other
                coroutine sees); worst, p99 and p50, in ms
  call time     the longest single append / take / remove / sync call, in ms
The same probe on an idle loop in the same run is the machine's noise floor; fsync_interval_s=None
(no fsync at all) isolates the cost of the file work from that of fsync.

Usage: python bench/bench_outbox_stall.py [--events 40000] [--rate 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
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
    directory: Path, msgs: list[WireMessage], args: argparse.Namespace, fsync: float | None
) -> dict[str, Any]:
    outbox = Outbox(directory, max_bytes=args.max_bytes, fsync_interval_s=fsync)
    calls = CallTimes()
    probe, stop = LoopProbe(), asyncio.Event()
    produced = asyncio.Event()
    per_tick = args.batch
    tick_s = per_tick / args.rate
    drain_per_tick = max(1, round(per_tick * args.drain))

    async def produce() -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        for start in range(0, len(msgs), per_tick):
            for msg in msgs[start : start + per_tick]:
                calls.timed("append", outbox.append, msg)
            due += tick_s
            await asyncio.sleep(max(0.0, due - loop.time()))
        produced.set()

    async def replay() -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        leased: list[int] = []
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
    try:
        await asyncio.gather(produce(), replay())
        elapsed = time.perf_counter() - start
    finally:
        stop.set()
        await asyncio.gather(probe_task, ticker)
        stats = outbox.stats()
        calls.timed("close", outbox.close)
    return {
        "lags_ms": probe.lags_ms,
        "calls": calls.worst_ms,
        "elapsed_s": elapsed,
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
    }
    for name in ("append", "take", "remove", "sync", "close"):
        row[f"{name} max ms"] = med([r["calls"].get(name) for r in rounds])
    if "dropped_overflow" in rounds[0]:
        row["dropped"] = med([r["dropped_overflow"] for r in rounds])
        row["s"] = med([r["elapsed_s"] for r in rounds])
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    msgs = messages(args.events)
    seconds = args.events / args.rate
    idle: list[dict[str, Any]] = []
    synced: list[dict[str, Any]] = []
    unsynced: list[dict[str, Any]] = []
    args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        for i in range(args.repeat):  # interleaved, so all cases see the same machine
            idle.append(await idle_round(min(seconds, 3.0)))
            synced.append(await outbox_round(root / f"sync{i}", msgs, args, 1.0))
            unsynced.append(await outbox_round(root / f"nosync{i}", msgs, args, None))
    rows = [
        summary("idle loop (noise floor)", idle),
        summary("outbox, fsync_interval_s=1.0", synced),
        summary("outbox, fsync_interval_s=None", unsynced),
    ]
    columns = ["case", "lag worst ms", "lag p99 ms", "lag p50 ms"]
    columns += ["append max ms", "take max ms", "remove max ms", "sync max ms", "close max ms", "dropped", "s"]
    print(table(rows, columns))
    print(
        f"median of {args.repeat} rounds; {args.events} appends at {args.rate:g}/s in batches of {args.batch}, "
        f"replay at {args.drain:g}x that, max_bytes={args.max_bytes}; probe sleeps {_PROBE_S * 1000:g} ms"
    )

    def strip(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "lags_ms"} | {"probes": len(r["lags_ms"])} for r in rounds]

    return {
        "params": vars(args) | {"dir": str(args.dir)},
        "rows": rows,
        "rounds": {"idle": strip(idle), "fsync_1s": strip(synced), "no_fsync": strip(unsynced)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=40_000, help="appends per round")
    parser.add_argument("--rate", type=float, default=10_000, help="appends per second")
    parser.add_argument("--batch", type=int, default=10, help="appends per producer tick")
    parser.add_argument("--drain", type=float, default=0.6, help="replay rate as a fraction of --rate")
    parser.add_argument("--max-bytes", type=int, default=2 * 2**20, help="outbox max_bytes (segments are 1/4)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the table shows medians")
    parser.add_argument(
        "--dir", type=Path, default=ROOT / ".cache", help="a real disk, not tmpfs"
    )
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(f"wrote {write_results('outbox_stall', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
