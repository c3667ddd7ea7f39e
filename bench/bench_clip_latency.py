"""Alert end → `clips` event, live: how long after an alert ends its clip is announced.

    python bench/bench_clip_latency.py [--pre-s 1] [--post-s 1] [--above 4]

The condition users run: `vidsentry serve` (a real process, default model, captions on) reading a
live RTSP camera (the test server playing the sample clip with its narration in real time, 79 s),
with clips on and a `count` rule (`above` people for 0.5 s, clearing after 0.5 s, 1 s cooldown)
so alerts start and end as the crowd changes. A NATS subscriber stamps each alert `end` and each
`clips` event as it arrives; for every clip, the latency is its arrival minus the arrival of the
last alert end it covers. By design a clip is cut once the stream's frames reach `ended_pts` +
`post_s`; the end event itself goes out `clear_s` (0.5 s) after `ended_pts`, so the designed wait
after the end event is `post_s` - `clear_s`, and the table gives what the latency adds beyond it
(the frames' own lag, cutting and writing the clip, publishing).

With `--fleet`, the same camera runs in a fleet of two workers (each with a clips directory of its
own, as on two machines): the table adds how long after its `clips` event each clip is listed by
the worker that did not record it (uploaded to the fleet's bucket, listed from there; polled every
0.1 s), and how long its first download from that worker takes (fetched from the bucket).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import ensure_sample, pct, table, write_results  # noqa: E402

from realtime.bus.embedded import EmbeddedNatsServer  # noqa: E402
from tests.support.rtsp import RtspServer  # noqa: E402
from tests.support.serve_process import ServeProcess  # noqa: E402

RUN_S = 85.0
CLEAR_S = 0.5


async def record(url: str, seconds: float, others: list[str] | None = None
                 ) -> tuple[dict[str, float], list[tuple[float, dict[str, Any]]], int, dict[str, float], list[float]]:
    """What arrived on NATS; with `others` (the workers' URLs), when each clip was first listed by
    a worker that did not record it, and how long its first download from there took."""
    ends: dict[str, float] = {}
    clips: list[tuple[float, dict[str, Any]]] = []
    starts = 0
    nc = await nats.connect(url)

    async def on_alert(msg: Any) -> None:
        nonlocal starts
        body = json.loads(msg.data)
        if body.get("event") == "end":
            ends[body["alert_id"]] = time.monotonic()
        else:
            starts += 1

    async def on_clip(msg: Any) -> None:
        clips.append((time.monotonic(), json.loads(msg.data)))

    await nc.subscribe("vidsentry.*.alerts", cb=on_alert)
    await nc.subscribe("vidsentry.*.clips", cb=on_clip)
    listed: dict[str, float] = {}
    downloads: list[float] = []
    if others:
        await watch_listing(others, seconds, listed, downloads)
    else:
        await asyncio.sleep(seconds)
    await nc.close()
    return ends, clips, starts, listed, downloads


async def watch_listing(urls: list[str], seconds: float, listed: dict[str, float], downloads: list[float]) -> None:
    import aiohttp

    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            owner = None
            async with http.get(f"{urls[0]}/api/streams") as reply:
                for stream in (await reply.json())["streams"]:
                    owner = stream.get("owner") if stream["id"] == "plaza" else owner
            other = next((u for u, n in zip(urls, ("w0", "w1"), strict=True) if n != owner), None)
            if owner is None or other is None:
                await asyncio.sleep(0.1)
                continue
            async with http.get(f"{other}/api/clips?stream=plaza") as reply:
                clips = (await reply.json())["clips"]
            for clip in clips:
                if clip["clip_id"] not in listed:
                    listed[clip["clip_id"]] = time.monotonic()
                    began = time.monotonic()
                    async with http.get(f"{other}{clip['links']['mp4']}") as video:
                        if video.status == 200 and len(await video.read()) == clip["bytes"]:
                            downloads.append(time.monotonic() - began)
            await asyncio.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--post-s", type=float, default=1.0)
    parser.add_argument("--pre-s", type=float, default=1.0)
    parser.add_argument("--above", type=int, default=4)
    parser.add_argument("--fleet", action="store_true", help="two workers in a fleet; time the other's listing")
    args = parser.parse_args()
    sample = ensure_sample()
    with tempfile.TemporaryDirectory(prefix="vidsentry-cliplat-") as tmp, \
            EmbeddedNatsServer(store_dir=Path(tmp) / "nats") as bus, \
            RtspServer(clip=sample, log_path=Path(tmp) / "rtsp.log") as rtsp:
        config = Path(tmp) / "site.yaml"
        fleet = {"fleet": {"name": "bench"}} if args.fleet else {}
        config.write_text(yaml.safe_dump({
            **fleet,
            "clips": {"enabled": True, "dir": str(Path(tmp) / "clips"), "pre_s": args.pre_s, "post_s": args.post_s},
            "sources": {"allow_local_hosts": True},
            "streams": [{"id": "plaza", "url": rtsp.url("/vtest"), "rules": [
                {"id": "crowd", "type": "count", "classes": ["Normal"], "above": args.above, "for_s": 0.5,
                 "clear_s": CLEAR_S, "cooldown_s": 1.0}]}],
        }))
        workers = []
        for name in ("w0", "w1") if args.fleet else ("w0",):
            (Path(tmp) / name).mkdir()
            workers.append(ServeProcess("--config", str(config), "--port", "0", "--nats-url", bus.url, "--node", name,
                                        log_dir=Path(tmp) / name,
                                        env={"VIDSENTRY_CLIPS__DIR": str(Path(tmp) / name / "clips")}))
        try:
            for serve in workers:
                serve.start()
            print(f"recording {RUN_S:g} s of a live camera ...", flush=True)
            urls = [str(w.url) for w in workers] if args.fleet else None
            ends, clips, starts, listed, downloads = asyncio.run(record(bus.url, RUN_S, urls))
        finally:
            for serve in workers:
                serve.terminate()
    latencies = []
    for arrived, body in clips:
        covered = [ends[a] for a in body["alert_ids"] if a in ends]
        if covered:
            latencies.append(arrived - max(covered))
    designed = args.post_s - CLEAR_S
    rows = [{
        "alerts": starts, "alert_ends": len(ends), "clips": len(clips),
        "latency_p50_s": pct(latencies, 50), "latency_p95_s": pct(latencies, 95),
        "beyond_design_p50_ms": None if not latencies else round((pct(latencies, 50) - designed) * 1000),
        "beyond_design_p95_ms": None if not latencies else round((pct(latencies, 95) - designed) * 1000),
        "clip_s_p50": pct([b["duration_s"] for _, b in clips], 50),
    }]
    if args.fleet:
        elsewhere = [listed[b["clip_id"]] - arrived for arrived, b in clips if b["clip_id"] in listed]
        rows[0].update({"listed_elsewhere": len(elsewhere), "listed_p50_s": pct(elsewhere, 50),
                        "listed_p95_s": pct(elsewhere, 95), "download_p50_s": pct(downloads, 50),
                        "mb_per_clip_min": round(sum(b["bytes"] for _, b in clips) / 1e6
                                                 / max(1e-9, sum(b["duration_s"] for _, b in clips)) * 60, 1)})
    print(table(rows, list(rows[0])))
    name = "bench_clip_latency" + ("_fleet" if args.fleet else "")
    path = write_results(name, {"pre_s": args.pre_s, "post_s": args.post_s, "above": args.above,
                                                "rows": rows,
                                                "latencies_s": [round(v, 3) for v in latencies]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
