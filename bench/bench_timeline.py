"""The timeline's index: how soon an event is searchable, and how fast a query is at 1 M entries.

    python bench/bench_timeline.py [--seconds 60] [--streams 8] [--entries 1000000] [--asks 20]
                                   [--skip-lag] [--skip-query] [--skip-ask]

Index lag (live, all stages on): a real `vidsentry serve` process (default model, captions on)
reads the sample clip as a live camera, and indexes the VIDSENTRY stream of a real nats-server.
Beside it, `--streams` more streams publish through the real publisher as other workers would:
a final caption every 1.5 s per stream (each with a unique word), 5 track updates a second (read
and skipped) and a description every 5 s. A poller asks the service's `GET /api/search` every
50 ms for the newest captions; each caption's lag is when it first showed up minus when it was
published (so it includes JetStream, the consumer, the commit and the HTTP query).

Query latency (in-process, on this machine): an index of `--entries` generated entries (captions,
descriptions, alerts, tracks from a 5,000-word vocabulary with a Zipf tail, over 8 streams and
30 days) is built once in a temporary file; then each query shape runs 30 times: a common word,
a rare word, a phrase, a prefix, an OR, with a stream and kind filter, newest first, and a
query too broad to rank (refused within the time limit).

Ask latency (in-process, against the vLLM simulator over HTTP with realistic delays: 0.35 s to the
first token, 15 ms per output token): `--asks` questions over an index of 100,000 generated
entries, each retrieved, answered (about 60 tokens, citing two entries) and checked (a JSON verdict
per citation), one after the other; retrieve, answer, check and total p50 / p95.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import ensure_sample, pct, table, write_results  # noqa: E402

from pipelines.event_bodies import caption_event, description_event, track_event  # noqa: E402
from pipelines.events import EventKind  # noqa: E402
from pipelines.tracker import LifecycleKind, TrackEvent  # noqa: E402
from realtime.bus.embedded import EmbeddedNatsServer  # noqa: E402
from realtime.bus.publisher import NatsEventPublisher  # noqa: E402
from realtime.timeline.entries import Entry  # noqa: E402
from realtime.timeline.errors import QueryTooBroad  # noqa: E402
from realtime.timeline.index import Filters, TimelineIndex  # noqa: E402
from realtime.timeline.query import parse  # noqa: E402
from tests.support.serve_process import ServeProcess  # noqa: E402

MARK = "zqmark"


# -- index lag ----------------------------------------------------------------------------------


async def publish_load(url: str, streams: int, seconds: float, sent: dict[str, float]) -> dict[str, int]:
    counts = {"captions": 0, "tracks": 0, "descriptions": 0}
    async with NatsEventPublisher(url, node="bench-other-worker") as publisher:
        start = time.monotonic()
        tick = 0
        while time.monotonic() - start < seconds:
            t = time.time()
            media = time.monotonic() - start
            for s in range(streams):
                stream = f"cam{s}"
                if tick % 30 == s % 30:  # every 1.5 s (ticks of 50 ms), spread over the streams
                    token = f"w{s}n{tick}"
                    words = [(f" {w}", media + i * 0.3, media + i * 0.3 + 0.25, 0.9)
                             for i, w in enumerate(["someone", "said", MARK, token + "."])]
                    event = caption_event(stream, segment_id=f"b{tick}", words=words, language="en", model="bench",
                                          captured_at=t)
                    sent[event.id] = time.monotonic()
                    await publisher.publish(event)
                    counts["captions"] += 1
                if tick % 4 == 0:  # 5 track updates a second
                    change = TrackEvent(kind=LifecycleKind.UPDATE, track_id=tick % 7, class_id=0, score=0.8,
                                        box=(1.0, 2.0, 3.0, 4.0), first_seen_pts=0.0, last_seen_pts=media, hits=3)
                    await publisher.publish(track_event(stream, change, {0: "person"}, pts=media, captured_at=t))
                    counts["tracks"] += 1
                if tick % 100 == s % 100:  # every 5 s
                    await publisher.publish(description_event(
                        stream, text="Two people talk near the entrance.", fields=None, window_start_pts=media - 5,
                        window_end_pts=media, frames=4, epoch=0, prompt_tokens=900, cached_tokens=800,
                        latency_ms=300.0, model="sim", captured_at=t))
                    counts["descriptions"] += 1
            tick += 1
            await asyncio.sleep(max(0.0, start + tick * 0.05 - time.monotonic()))
        await publisher.flush(10)
    return counts


async def poll(base: str, seen: dict[str, float], stop: asyncio.Event) -> int:
    polls = 0
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            async with session.get(f"{base}/api/search", params={"q": MARK, "order": "newest", "limit": "100",
                                                                  "kind": "captions"}) as response:
                body: Any = await response.json()
            now = time.monotonic()
            polls += 1
            for hit in body.get("hits", []):
                seen.setdefault(hit["event_id"], now)
            await asyncio.sleep(0.05)
    return polls


async def lag_run(base: str, url: str, streams: int, seconds: float) -> dict[str, Any]:
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    stop = asyncio.Event()
    poller = asyncio.create_task(poll(base, seen, stop))
    counts = await publish_load(url, streams, seconds, sent)
    await asyncio.sleep(3.0)  # the last ones land
    stop.set()
    polls = await poller
    lags = [1000 * (seen[i] - sent[i]) for i in sent if i in seen]
    async with aiohttp.ClientSession() as session, session.get(f"{base}/api/streams/plaza") as response:
        plaza = await response.json()
    return {
        "streams": streams, "published": counts, "polls": polls,
        "captions_found": len(lags), "captions_missing": len(sent) - len(lags),
        "lag_p50_ms": pct(lags, 50), "lag_p95_ms": pct(lags, 95), "lag_max_ms": round(max(lags)) if lags else None,
        "camera_state": plaza.get("state"), "camera_frames_processed": plaza["counters"].get("frames_processed"),
        "camera_captions": plaza["counters"].get("captions"),
    }


def index_lag(streams: int, seconds: float) -> dict[str, Any]:
    sample = ensure_sample()
    with tempfile.TemporaryDirectory(prefix="vidsentry-tlbench-") as tmp, \
            EmbeddedNatsServer(store_dir=Path(tmp) / "nats") as bus:
        config = Path(tmp) / "site.yaml"
        config.write_text(yaml.safe_dump({
            "streams": [{"id": "plaza", "url": str(sample), "realtime": True}],
            "sources": {"local_dirs": [str(sample.parent)]},
        }))
        serve = ServeProcess("--config", str(config), "--port", "0", "--nats-url", bus.url, log_dir=Path(tmp))
        serve.start()
        try:
            assert serve.url is not None
            time.sleep(3.0)  # the camera is live, the detector and captions busy
            print(f"publishing {streams} more streams for {seconds:g} s beside a live camera ...", flush=True)
            return asyncio.run(lag_run(serve.url, bus.url, streams, seconds))
        finally:
            serve.terminate()


# -- query latency ------------------------------------------------------------------------------


def vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {"".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(6000)}
    common = ["the", "a", "person", "door", "car", "walks", "near", "left", "right", "red", "blue", "bag",
              "delivery", "parking", "entrance", "someone", "said", "package", "truck", "dog"]
    return common + sorted(words - set(common))[:5000 - len(common)]


def build(path: Path, count: int) -> tuple[TimelineIndex, float, list[str]]:
    rng = random.Random(7)
    vocab = vocabulary(rng)
    weights = [1.0 / (i + 1) ** 1.1 for i in range(len(vocab))]  # Zipf: a few words are everywhere
    index = TimelineIndex(path, max_entries=count * 2, max_age_s=40 * 86400)
    now = time.time()
    start = time.monotonic()
    batch: list[tuple[int, Entry]] = []
    kinds = [EventKind.CAPTIONS] * 6 + [EventKind.DESCRIPTIONS] * 2 + [EventKind.TRACKS, EventKind.ALERTS]
    for n in range(count):
        kind = kinds[n % len(kinds)]
        length = {EventKind.CAPTIONS: 12, EventKind.DESCRIPTIONS: 25}.get(kind, 6)
        words = rng.choices(vocab, weights, k=length) + ["."]
        pts = (n // 8) * 2.5
        extra: dict[str, Any] = {}
        if kind is EventKind.CAPTIONS:
            extra["times"] = [[round(pts + i * 0.2, 3), round(pts + i * 0.2 + 0.15, 3)] for i in range(length)]
        batch.append((n + 1, Entry(f"e{n}", f"cam{n % 8}", kind, pts, pts + 2.0,
                                   now - 30 * 86400 + n * (30 * 86400 / count), " ".join(words[:-1]) + ".", extra)))
        if len(batch) == 5000:
            index.add(batch, n + 1, now=now)
            batch.clear()
            if (n + 1) % 100_000 == 0:
                print(f"  {n + 1:,} entries, {time.monotonic() - start:.0f} s", flush=True)
    if batch:
        index.add(batch, count, now=now)
    return index, time.monotonic() - start, vocab


def query_latency(count: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vidsentry-tlquery-") as tmp:
        print(f"building an index of {count:,} entries ...", flush=True)
        index, built_s, vocab = build(Path(tmp) / "t.db", count)
        size_mb = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 1e6
        rare = vocab[3000]
        shapes = {
            "common word": ("person", Filters()),
            "rare word": (rare, Filters()),
            "two words": ("delivery truck", Filters()),
            "phrase": ('"parking entrance"', Filters()),
            "prefix": ("deliv*", Filters()),
            "or": ("dog OR package", Filters()),
            "stream+kind filter": ("door", Filters(streams=("cam3",), kinds=("captions",))),
            "last hour, newest": ("person", Filters(since=time.time() - 3600)),
            "very broad (the a)": ("the OR a", Filters()),
        }
        rows = []
        for name, (text, filters) in shapes.items():
            times: list[float] = []
            refused = 0
            hits = 0
            for _ in range(30):
                started = time.perf_counter()
                try:
                    found, _ = index.search(parse(text), filters, limit=20, offset=0)
                    hits = len(found)
                except QueryTooBroad:
                    refused += 1
                times.append(1000 * (time.perf_counter() - started))
            rows.append({"query": name, "q": text, "hits": hits, "refused": refused,
                         "p50_ms": pct(times, 50), "p95_ms": pct(times, 95)})
        index.close()
    return {"entries": count, "build_s": round(built_s, 1), "entries_per_s": round(count / built_s),
            "file_mb": round(size_mb), "queries": rows}


def ask_latency(asks: int) -> dict[str, Any]:
    from engines.vlm.client import VlmSettings, create_vlm_client
    from realtime.timeline.ask import Asker
    from realtime.timeline.query import retrieval_query
    from tests.support.vllm_sim import VllmSimulator

    def answer(body: dict[str, Any]) -> str:
        if (body.get("response_format") or {}).get("type") == "json_schema":
            return json.dumps({"verdicts": [{"claim": 1, "evidence": "E1", "supported": True},
                                            {"claim": 2, "evidence": "E2", "supported": True}]})
        return ("A person carried a package past the entrance while a truck waited near the door [E1]. "
                "Someone said the delivery was left on the right side of the parking area [E2].")

    async def run(index: TimelineIndex) -> list[dict[str, float]]:
        async with VllmSimulator(answer=answer, latency_s=0.35, per_token_s=0.015) as sim:
            client = create_vlm_client(VlmSettings(endpoints=(sim.url,), model=sim.model))

            async def retrieve(question: str, filters: Filters, limit: int) -> list[Any]:
                hits, _ = await asyncio.to_thread(index.search, retrieval_query(question), filters, limit=limit,
                                                  offset=0)
                return hits

            asker = Asker(retrieve, client, sim.model, timeout_s=60.0)
            rng = random.Random(11)
            timings = []
            for _ in range(asks):
                words = rng.sample(["person", "package", "truck", "door", "delivery", "entrance", "dog", "bag"], 3)
                result = await asker.ask(f"when did the {words[0]} with the {words[1]} reach the {words[2]}?",
                                         Filters())
                timings.append(result.timings_ms)
            await client.aclose()
            return timings

    with tempfile.TemporaryDirectory(prefix="vidsentry-tlask-") as tmp:
        print("building an index of 100,000 entries for asking ...", flush=True)
        index, _, _ = build(Path(tmp) / "a.db", 100_000)
        timings = asyncio.run(run(index))
        index.close()
    return {"asks": asks, **{f"{k}_p50_ms": pct([t[k] for t in timings], 50) for k in ("retrieve", "answer", "check",
                                                                                       "total")},
            **{f"{k}_p95_ms": pct([t[k] for t in timings], 95) for k in ("retrieve", "answer", "check", "total")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--skip-lag", action="store_true")
    parser.add_argument("--skip-query", action="store_true")
    parser.add_argument("--asks", type=int, default=20)
    parser.add_argument("--skip-ask", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if not args.skip_lag:
        lag = index_lag(args.streams, args.seconds)
        results["lag"] = lag
        print(table([lag], ["streams", "captions_found", "captions_missing", "lag_p50_ms", "lag_p95_ms", "lag_max_ms",
                            "camera_frames_processed", "camera_captions"]))
    if not args.skip_query:
        query = query_latency(args.entries)
        results["query"] = query
        print(f"{query['entries']:,} entries built in {query['build_s']} s ({query['entries_per_s']:,}/s), "
              f"{query['file_mb']} MB")
        print(table(query["queries"], ["query", "q", "hits", "refused", "p50_ms", "p95_ms"]))
    if not args.skip_ask:
        asked = ask_latency(args.asks)
        results["ask"] = asked
        print(table([asked], list(asked)))
    path = write_results("bench_timeline", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
