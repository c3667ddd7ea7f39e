"""Fleet of `vidsentry serve` workers: fail-over time, lease and KV traffic, listing latency.

    python bench/bench_fleet.py [--kills 10] [--ttl 3] [--renew 1] [--listed 500]

Three workers (real processes) on one nats-server share six live RTSP streams (detect_fps 1).
  * fail-over: SIGKILL the worker holding the most streams; seconds until each of its streams is
    `live` on another worker (listing polled every 0.1 s); the worker is started again before
    the next kill. p50 / max over every moved stream of every kill.
  * traffic: messages and bytes written to the fleet's two KV buckets (seen on their `$KV.>`
    subjects) over a steady-state window, per stream per minute.
  * listing: GET /api/streams latency with `--listed` streams in the fleet (capacity keeps all
    but twelve unowned: capacity 4 a worker), asked of each of the three workers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import nats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import pct, table, write_results  # noqa: E402

from engines.models import nudenet_model_path  # noqa: E402
from realtime.bus.embedded import EmbeddedNatsServer  # noqa: E402
from realtime.leases.records import desired_bucket, lease_bucket  # noqa: E402
from tests.realtime.fleet.fleet_support import Fleet, Worker, http, poll  # noqa: E402
from tests.support.rtsp import RtspServer  # noqa: E402

STREAMS = [f"cam{i}" for i in range(6)]


def listing(worker: Worker) -> dict[str, tuple[str | None, str]]:
    return {sid: (s["owner"], s["state"]) for sid, s in worker.streams().items()}


def fail_over(fleet: Fleet, kills: int, limit_s: float) -> list[float]:
    times: list[float] = []
    for round_ in range(kills):
        alive = fleet.live()
        view = listing(alive[0])
        load = collections.Counter(owner for sid, (owner, _) in view.items() if sid in STREAMS)
        victim = fleet.workers[load.most_common(1)[0][0]]
        watcher = next(w for w in alive if w is not victim)
        moved = {sid for sid in STREAMS if view[sid][0] == victim.name}
        victim.signal(signal.SIGKILL)
        killed = time.monotonic()
        pending = set(moved)
        while pending and time.monotonic() - killed < limit_s:
            now = listing(watcher)
            for sid in list(pending):
                owner, state = now[sid]
                if owner not in (None, victim.name) and state == "live":
                    times.append(time.monotonic() - killed)
                    pending.discard(sid)
            time.sleep(0.1)
        if pending:
            raise SystemExit(f"kill {round_ + 1}: {sorted(pending)} not live elsewhere within {limit_s} s")
        victim.serve.wait(10)
        del fleet.workers[victim.name]
        fleet.start(victim.name)
        print(f"kill {round_ + 1}/{kills}: {len(moved)} streams moved, slowest {max(times[-len(moved):]):.2f} s",
              flush=True)
    return times


def kv_traffic(nats_url: str, fleet_name: str, seconds: float) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {"leases": {"msgs": 0, "bytes": 0}, "desired": {"msgs": 0, "bytes": 0}}

    async def watch() -> None:
        nc = await nats.connect(nats_url)

        def counter(name: str) -> Any:
            async def take(msg: Any) -> None:
                counts[name]["msgs"] += 1
                counts[name]["bytes"] += len(msg.data) + sum(len(k) + len(v) for k, v in (msg.headers or {}).items())
            return take

        await nc.subscribe(f"$KV.{lease_bucket(fleet_name)}.>", cb=counter("leases"))
        await nc.subscribe(f"$KV.{desired_bucket(fleet_name)}.>", cb=counter("desired"))
        await asyncio.sleep(seconds)
        await nc.close()

    thread = threading.Thread(target=lambda: asyncio.run(watch()))
    thread.start()
    thread.join()
    return counts


def list_latency(fleet: Fleet, total: int, rtsp_url: str, requests: int) -> dict[str, Any]:
    first = fleet.live()[0]
    for i in range(total - len(STREAMS)):
        status, body = http("POST", f"{first.url}/api/streams",
                            {"id": f"idle{i}", "url": rtsp_url, "audio": False, "detect_fps": 1})
        assert status == 201, body
    for worker in fleet.live():
        poll(lambda w=worker: len(w.streams()) >= total, 30, f"{worker.name} to list {total}")
    out: dict[str, Any] = {}
    for worker in fleet.live():
        took = []
        for _ in range(requests):
            began = time.perf_counter()
            status, body = http("GET", f"{worker.url}/api/streams")
            took.append((time.perf_counter() - began) * 1000)
            assert status == 200 and len(body["streams"]) >= total
        out[worker.name] = {"p50_ms": pct(took, 50), "p95_ms": pct(took, 95), "max_ms": round(max(took), 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--ttl", type=float, default=3.0, help="fleet.lease_ttl_s")
    parser.add_argument("--renew", type=float, default=1.0, help="fleet.renew_interval_s")
    parser.add_argument("--traffic-s", type=float, default=30.0, help="steady-state window for KV traffic")
    parser.add_argument("--listed", type=int, default=500, help="streams in the fleet for the listing latency")
    parser.add_argument("--requests", type=int, default=20, help="listing requests per worker")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    server = EmbeddedNatsServer(store_dir=root / "nats")
    server.start()
    rtsp = RtspServer(log_path=root / "rtsp.log").start()
    # Capacity 4: room for a dead worker's streams; of the listing's idle streams at most six more run.
    fleet = Fleet(server.url, nudenet_model_path(), root, name="bench", capacity=4,
                  fleet={"lease_ttl_s": args.ttl, "renew_interval_s": args.renew})
    try:
        began = time.monotonic()
        workers = fleet.start("w0", "w1", "w2")
        print(f"3 workers ready in {time.monotonic() - began:.1f} s", flush=True)
        for sid in STREAMS:
            status, body = http("POST", f"{workers[0].url}/api/streams",
                                {"id": sid, "url": rtsp.url("/test"), "audio": False, "detect_fps": 1})
            assert status == 201, body
        poll(lambda: all(s == "live" for _, s in listing(workers[0]).values()), 60, "six streams live")
        traffic = kv_traffic(server.url, "bench", args.traffic_s)
        minutes = args.traffic_s / 60
        per_stream = {name: {"msgs": round(c["msgs"] / len(STREAMS) / minutes, 1),
                             "bytes": round(c["bytes"] / len(STREAMS) / minutes)} for name, c in traffic.items()}
        times = fail_over(fleet, args.kills, limit_s=args.ttl + args.renew + 30)
        latency = list_latency(fleet, args.listed, rtsp.url("/test"), args.requests)
    finally:
        fleet.stop_all()
        rtsp.close()
        server.stop()

    failover = {"kills": args.kills, "streams_moved": len(times), "p50_s": pct(times, 50),
                "max_s": round(max(times), 2), "mean_s": round(statistics.mean(times), 2)}
    rows = [
        {"measure": "fail-over p50 / max (s)", "value": f"{failover['p50_s']} / {failover['max_s']}",
         "note": f"{args.kills} kills, {len(times)} streams, TTL {args.ttl} s, renew {args.renew} s"},
        {"measure": "lease KV msgs / stream / min", "value": per_stream["leases"]["msgs"],
         "note": f"{per_stream['leases']['bytes']} B (renewals + node records)"},
        {"measure": "desired KV msgs / stream / min", "value": per_stream["desired"]["msgs"],
         "note": f"{per_stream['desired']['bytes']} B (steady state)"},
    ]
    rows += [{"measure": f"GET /api/streams, {args.listed} streams, {name}", "value": f"{v['p50_ms']} ms p50",
              "note": f"p95 {v['p95_ms']} ms, max {v['max_ms']} ms"} for name, v in latency.items()]
    print(table(rows, ["measure", "value", "note"]))
    path = write_results("fleet", {
        "settings": {"ttl_s": args.ttl, "renew_s": args.renew, "workers": 3, "streams": len(STREAMS)},
        "failover": failover, "failover_times_s": [round(t, 2) for t in times],
        "kv_traffic_per_stream_per_min": per_stream, "traffic_window_s": args.traffic_s,
        "list_latency_ms": latency, "listed": args.listed,
    })
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
