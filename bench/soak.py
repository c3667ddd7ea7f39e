"""Sustained load on real parts: every stream, every capability and the faults of a day at once.

Each fault found before was found by probing one thing at a time; this runs them together for as
long as asked: a real `vidsentry serve`, a real nats-server (JetStream, the disk outbox), the
GStreamer RTSP test server and the VLM simulator, with the load of tests/support/load.py:
  - --cameras RTSP cameras with audio: half play a clip with speech (looped, never ending), one
    drops (its server killed) every --flap-every seconds and comes back, one switches its picture
    size every --resize-every seconds, the rest a live test pattern with a tone;
  - --peers aiortc browser peers (pre-encoded VP8 and Opus speech) that come and go;
  - clips on, the timeline on, rules that fire on the speech cameras, descriptions (VLM simulator),
    a server-sent-events reader on every camera, DataChannel readers on the peers, an `ask` every
    --ask-every seconds.
A 2-core machine is overloaded by this on purpose: overload must degrade by policy (fewer measured
frames, shorter caption windows), never grow or break.

Every --interval seconds a sample of the serve process (RSS, fds, threads, asyncio tasks, queues and
buffers, per-stream measured / predicted fps, caption lag, audio dropped, outbox and clip-store
sizes, index lag) is appended to bench/results/soak-<time>.json, rewritten as it goes, so a run cut
short leaves its samples. At the end: durable events lost or duplicated (JetStream against what
the service counted and what went over the wire), every listed clip decoded, every final caption
in the index; then the targets: the last third's slope of RSS, fds, threads and tasks against
their level (per 10 minutes), restarts, caption lag and detection rate drift, lost / duplicated.

Usage: python bench/soak.py [--minutes 30] [--cameras 8] [--peers 4] [--work DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import RESULTS, table

from tests.support.load import LoadPlan
from tests.support.soak import SoakResult, run_soak, targets, write_json


def progress(result: SoakResult, path: Path, args: argparse.Namespace) -> None:
    payload = {"benchmark": "soak", "command": " ".join(sys.argv), "partial": not result.events,
               **result.as_dict(), "targets": targets(result)}
    write_json(path, payload)
    if result.samples and not result.events:
        s = result.samples[-1]
        streams = s["streams"].values()
        processed = sum(r.get("processed_fps") or 0 for r in streams)
        predicted = sum(r.get("predicted_fps") or 0 for r in streams)
        lag = max((r.get("caption_lag_seconds") or 0 for r in streams), default=0)
        print(f"t={s['t_s']:7.1f}s rss={s['rss_bytes'] / 2**20:7.1f}MB fds={s['open_fds']:.0f} "
              f"threads={s['os_threads']:.0f} tasks={s['asyncio_tasks']:.0f} ready={s['ready']} "
              f"fps processed={processed:.1f} predicted={predicted:.1f} max_caption_lag={lag:.2f}s "
              f"outbox={s['outbox_events']} clips={s['clip_files']} index_pending={s['timeline_pending']} "
              f"peers={s['webrtc_sessions']}", flush=True)


def report(result: SoakResult) -> dict[str, Any]:
    found = targets(result)
    slopes = found.get("last_third_slope_pct_per_10min", {})
    levels = found.get("last_third_level", {})
    rows = [{"figure": f"slope {k} (% of level / 10 min)", "value": slopes.get(k), "target": "< 1",
             "level": levels.get(k)} for k in slopes]
    rows += [
        {"figure": "stream restarts", "value": found.get("stream_restarts"), "target": "0"},
        {"figure": "task crashes", "value": found.get("task_crashes"), "target": "0"},
        {"figure": "durable lost", "value": found.get("lost"), "target": "0"},
        {"figure": "durable duplicated", "value": found.get("duplicated"), "target": "0"},
        {"figure": "clips that do not decode", "value": found.get("clips_bad"), "target": "0",
         "level": result.clips.get("listed")},
        {"figure": "captions missing from index", "value": found.get("captions_missing_from_index"), "target": "0"},
        {"figure": "samples not ready", "value": found.get("not_ready_samples"), "target": "0"},
    ]
    for name, thirds in found.get("drift", {}).items():
        rows.append({"figure": f"{name} middle -> last third", "value": thirds.get("last_third"),
                     "level": thirds.get("middle_third"), "target": "steady"})
    print(table(rows, ["figure", "value", "level", "target"]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--cameras", type=int, default=8)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--flap-every", type=float, default=180.0)
    parser.add_argument("--resize-every", type=float, default=60.0)
    parser.add_argument("--ask-every", type=float, default=60.0)
    parser.add_argument("--work", type=Path, help="directory for logs, the NATS store, clips, the index")
    args = parser.parse_args()
    seconds = args.minutes * 60
    plan = LoadPlan(cameras=args.cameras, peers=args.peers, seconds=seconds, flap_every_s=args.flap_every,
                    resize_every_s=args.resize_every, ask_every_s=args.ask_every)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"soak-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    work = args.work or Path(tempfile.mkdtemp(prefix="vidsentry-soak-"))
    print(f"soak: {args.minutes:g} min, {args.cameras} cameras, {args.peers} peers; work in {work}; "
          f"samples in {path}", flush=True)
    # SIGTERM (nohup'd runs are stopped so) unwinds like Ctrl-C: the servers started here are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    result = asyncio.run(run_soak(plan, work, seconds=seconds, interval_s=args.interval,
                                  on_sample=lambda r: progress(r, path, args)))
    found = report(result)
    print(json.dumps({"events": {k: v for k, v in result.events.items() if k != "kinds"}, "clips": result.clips,
                      "index": result.index, "load": result.load}, default=str)[:4000])
    print(f"wrote {path}")
    ok = found.get("lost") == 0 and found.get("duplicated") == 0 and not found.get("clips_bad") \
        and not found.get("captions_missing_from_index")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
