"""Chaos on a 3-node NATS cluster and a 3-worker fleet, under load: what each fault costs.

    python bench/chaos.py [--cameras 3] [--down 10] [--freeze 30] [--only kill,freeze,leader,rolling,worker]

Real parts throughout: three nats-server processes routed into one cluster (VIDSENTRY, the fleet's
KV buckets and its clip object store all with 3 replicas), three `vidsentry serve --fleet`
workers, and the GStreamer RTSP test server playing the sample clip to each camera (every camera
starts it again at its end, through the supervisor's reconnect). Clips and the timeline are on
and a `present` rule fires on every person, so clips are cut and uploaded all the time.

The schedule, one fault after another, each once the fleet is whole again:
  kill     SIGKILL the node worker w0 talks to; start it again `--down` s later
  freeze   SIGSTOP the node worker w1 talks to for `--freeze` s (connected, silent), then SIGCONT
  leader   SIGKILL the node that leads VIDSENTRY (from JetStream's stream info); back after `--down`
  rolling  restart all three nodes, one at a time, each once the cluster is whole again
  worker   SIGKILL the worker that holds the timeline lease while it records a clip; start it again

For each fault: durable events lost and duplicated (every durable event heard on the wire
against what VIDSENTRY stores), seconds until publishing (acks flowing, nothing more waiting than
before), indexing (a marker published at the fault found by search), clip upload and stream
ownership are back, and how long `/readyz` said not-ready against how long acks really stalled.
Prints a table and writes bench/results/chaos-<time>.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import ensure_sample, table, write_results  # noqa: E402

from engines.models import fall_model_path  # noqa: E402
from tests.support.chaos import ChaosRig, FaultReport, stream_leader  # noqa: E402
from tests.support.nats_cluster import NatsCluster, start_cluster  # noqa: E402
from tests.support.rtsp import RtspServer  # noqa: E402

FAULTS = ("kill", "freeze", "leader", "rolling", "worker")
COLUMNS = ["fault", "lost", "duplicated", "durable_in_window", "stream_leaderless_s", "publishing_back_s",
           "publishing_after_leader_s", "longest_ack_gap_s",
           "indexing_back_s", "clip_upload_back_s", "ownership_back_s", "not_ready_s", "stalled_s",
           "not_ready_while_working_s", "ready_while_stalled_s"]


def run_fault(rig: ChaosRig, fault: str, args: argparse.Namespace) -> FaultReport:
    cluster = rig.cluster
    if fault == "kill":
        victim = rig.serving_node("vidsentry-publisher@w0")
        return rig.node_fault(f"SIGKILL {victim.name} (w0's node) for {args.down:g} s", victim, down_s=args.down)
    if fault == "freeze":
        victim = rig.serving_node("vidsentry-publisher@w1")
        return rig.node_fault(f"SIGSTOP {victim.name} (w1's node) for {args.freeze:g} s", victim,
                              down_s=args.freeze, how="stop")
    if fault == "leader":
        victim = cluster.node(stream_leader(rig.urls))
        return rig.node_fault(f"SIGKILL {victim.name} (VIDSENTRY's leader) for {args.down:g} s", victim,
                              down_s=args.down)
    if fault == "rolling":
        return rig.rolling_restart()
    if fault == "worker":
        return rig.kill_indexing_worker()
    raise SystemExit(f"unknown fault {fault}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cameras", type=int, default=3)
    parser.add_argument("--detect-fps", type=float, default=2.0)
    parser.add_argument("--down", type=float, default=10.0, help="seconds a killed node stays down")
    parser.add_argument("--freeze", type=float, default=30.0, help="seconds a node stays SIGSTOPped")
    parser.add_argument("--gap", type=float, default=10.0, help="quiet seconds between faults")
    parser.add_argument("--only", default=",".join(FAULTS))
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs, stores)")
    args = parser.parse_args(argv)
    faults = [f for f in args.only.split(",") if f]
    clip = ensure_sample()
    root = Path(tempfile.mkdtemp(prefix="vidsentry-chaos-"))
    print(f"chaos: run directory {root}", flush=True)
    began = time.monotonic()
    load_before = os.getloadavg()
    rtsp = RtspServer(clip=clip, log_path=root / "rtsp.log").start()
    cluster: NatsCluster | None = None
    rig: ChaosRig | None = None
    results: dict[str, Any] = {}
    failed: dict[str, str] = {}
    try:
        cluster = start_cluster(root / "nats")
        (root / "fleet").mkdir()
        rig = ChaosRig(cluster, fall_model_path(), root / "fleet", [rtsp.url("/vtest")] * args.cameras,
                       detect_fps=args.detect_fps)
        rig.start()
        # Warm-up: clips cut and uploaded, the marker of a quiet moment indexed, before any fault.
        rig.wait(lambda: any(s.uploads > 0 for s in rig.sampler.series()), 180, "a first clip uploaded")
        baseline = rig.settle(rig.begin("none (baseline)"))
        print(f"baseline: {baseline.measured}", flush=True)
        for fault in faults:
            time.sleep(args.gap)  # a quiet stretch between faults keeps their windows apart
            try:
                report = run_fault(rig, fault, args)
            except (TimeoutError, RuntimeError, AssertionError) as exc:
                # One fault that could not be set up or measured still leaves the others' figures.
                print(f"{fault}: failed: {exc!r}", flush=True)
                failed[fault] = repr(exc)
                continue
            print(f"{report.name}: {report.measured} {report.notes}", flush=True)
        account = rig.account()
        rows = [{"fault": r.name, **r.measured} for r in rig.reports]
        print()
        print(table(rows, COLUMNS))
        print(f"\noverall: {account}")
        if failed:
            print(f"faults that failed: {failed}")
        results = {
            "config": vars(args), "load_before": load_before, "load_after": os.getloadavg(),
            "wall_s": round(time.monotonic() - began, 1), "overall": account, "failed": failed,
            "faults": [{"fault": r.name, "notes": r.notes, **r.measured} for r in rig.reports],
        }
        rig.dump(root / "samples.json")  # kept with --keep: every sample, for a second look
        path = write_results(time.strftime("chaos-%Y%m%dT%H%M%SZ", time.gmtime()), results)
        print(f"wrote {path}; load average before {load_before}, after {os.getloadavg()}")
    finally:
        if rig is not None:
            rig.close()
        if cluster is not None:
            cluster.stop()
        rtsp.close()
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
