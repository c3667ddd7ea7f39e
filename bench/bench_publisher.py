"""NATS publisher throughput: durable events with JetStream acks, and live detections over core NATS.

Everything runs against a real embedded nats-server (JetStream, file store) on loopback. Each
figure comes with a baseline from the same run, so the ratio means something on a shared box:
  durable  NatsEventPublisher.publish + flush  vs  bare js.publish_async of the same bytes
  live     NatsEventPublisher.publish + flush  vs  bare nc.publish of the same bytes
plus the creation->ack delay (publish() called -> JetStream ack processed) p50/p99, for a burst
(queueing behind max_pending_acks dominates) and paced at a steady rate (the delay a subscriber
sees in normal operation), and lost / duplicated events (stream message count, subscriber
receipt count; both must be 0).

Usage: python bench/bench_publisher.py [--durable 20000] [--live 50000] [--pending 100 1000] [--paced-rate 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import pct, table, write_results

from engines.types import Detections
from pipelines import event_bodies
from pipelines.events import Event, EventKind
from pipelines.frames import FrameResult
from pipelines.tracker import LifecycleKind, TrackEvent
from realtime.bus.cloudevents import encode, subject_for
from realtime.bus.connection import round_trip
from realtime.bus.delivery import WireMessage
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import STREAM_NAME
from realtime.bus.publisher import NatsEventPublisher


class AckDelays:
    """DeliveryHooks that records creation->ack delays."""

    def __init__(self) -> None:
        self.delays_ms: list[float] = []
        self.duplicates = 0
        self.undeliverable = 0

    def on_acked(self, msg: WireMessage, delay_s: float, duplicate: bool) -> None:
        self.delays_ms.append(delay_s * 1000)
        self.duplicates += duplicate

    def on_undeliverable(self, msg: WireMessage, error: BaseException) -> None:
        self.undeliverable += 1


NAMES = {0: "person"}


def track_event(i: int, stream_id: str) -> Event:
    box = np.array([10 + i % 50, 20, 110, 220], dtype=np.float32)
    change = TrackEvent(LifecycleKind.UPDATE, i % 40, 0, 0.87, box, first_seen_pts=0.0, last_seen_pts=i / 25, hits=i)
    return event_bodies.track_event(stream_id, change, NAMES, pts=i / 25, captured_at=time.time())


def detection_event(i: int, stream_id: str) -> Event:
    boxes = np.tile(np.array([[10, 20, 110, 220]], dtype=np.float32), (5, 1)) + i % 7
    detections = Detections(boxes, np.full(5, 0.8, np.float32), np.zeros(5, np.int32))
    result = FrameResult(i, stream_id, i / 25, i / 25, time.time(), 640, 480, detections, inference_ms=20.0)
    return event_bodies.detections_event(result, list(range(5)), NAMES, model="bench", backend="cpu", batch_size=1)


async def stored_count(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info(STREAM_NAME)).state.messages)
    finally:
        await nc.close()


async def bare_durable(url: str, n: int, stream_id: str) -> float:
    """Baseline: js.publish_async of pre-encoded events, then wait for all acks."""
    encoded = [
        (subject_for(e), *encode(e, "bench", time.time())) for e in (track_event(i, stream_id) for i in range(n))
    ]
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=4000)
    try:
        start = time.perf_counter()
        futures = [await js.publish_async(subject, payload, headers=headers) for subject, payload, headers in encoded]
        await js.publish_async_completed()
        rate = n / (time.perf_counter() - start)
        failed = [f for f in futures if f.exception() is not None]
        if failed:
            raise RuntimeError(f"baseline: {len(failed)} of {n} publishes failed: {failed[0].exception()!r}")
        return rate
    finally:
        await nc.close()


async def publisher_durable(
    url: str, n: int, stream_id: str, pending: int, rate: float | None = None
) -> dict[str, Any]:
    """A burst as fast as publish() returns, or paced at `rate` events/s (ticks of 10 ms)."""
    hooks = AckDelays()
    events = [track_event(i, stream_id) for i in range(n)]
    pub = NatsEventPublisher(url, node="bench", max_pending_acks=pending, hooks=hooks)
    await pub.connect()
    per_tick = max(1, round(rate / 100)) if rate else n
    try:
        start = time.perf_counter()
        for i, ev in enumerate(events):
            await pub.publish(ev)
            if rate and (i + 1) % per_tick == 0:
                await asyncio.sleep(max(0.0, start + (i + 1) / rate - time.perf_counter()))
        flushed = await pub.flush(120)
        elapsed = time.perf_counter() - start
        stats = pub.stats.kind(EventKind.TRACKS)
    finally:
        await pub.close()
    return {
        "events_per_s": n / elapsed,
        "ack_p50_ms": pct(hooks.delays_ms, 50),
        "ack_p99_ms": pct(hooks.delays_ms, 99),
        "acked": stats.acked,
        "failed": stats.failed,
        "duplicates": hooks.duplicates,
        "flushed": flushed,
    }


async def bare_live(url: str, n: int, stream_id: str) -> float:
    encoded = [
        (subject_for(e), *encode(e, "bench", time.time())) for e in (detection_event(i, stream_id) for i in range(n))
    ]
    nc = await nats.connect(url)
    try:
        start = time.perf_counter()
        for subject, payload, headers in encoded:
            await nc.publish(subject, payload, headers=headers)
        await round_trip(nc)
        return n / (time.perf_counter() - start)
    finally:
        await nc.close()


async def publisher_live(url: str, n: int, stream_id: str) -> dict[str, Any]:
    events = [detection_event(i, stream_id) for i in range(n)]
    received = 0
    done = asyncio.Event()

    async def count(msg: Any) -> None:
        nonlocal received
        received += 1
        if received >= n:
            done.set()

    listener = await nats.connect(url, pending_size=64 * 2**20)
    await listener.subscribe(f"vidsentry.{stream_id}.detections", cb=count, pending_msgs_limit=4 * n)
    await round_trip(listener)
    pub = NatsEventPublisher(url, node="bench")
    await pub.connect()
    try:
        start = time.perf_counter()
        for ev in events:
            await pub.publish(ev)
        await pub.flush(60)
        elapsed = time.perf_counter() - start
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 30)
        stats = pub.stats.kind(EventKind.DETECTIONS)
    finally:
        await pub.close()
        await listener.close()
    return {
        "events_per_s": n / elapsed,
        "received": received,
        "failed": stats.failed,
        "dropped": stats.dropped,
        "bytes_per_event": len(encode(events[0], "bench", time.time())[0]),
    }


def encode_rate(n: int) -> float:
    events = [track_event(i, "enc") for i in range(n)]
    start = time.perf_counter()
    for ev in events:
        encode(ev, "bench", time.time())
    return n / (time.perf_counter() - start)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    lost_or_dup = 0
    with tempfile.TemporaryDirectory() as store, EmbeddedNatsServer(store_dir=Path(store)) as server:
        url = server.url
        async with NatsEventPublisher(url, node="bench"):  # creates the stream for the baselines
            pass
        enc = encode_rate(min(args.durable, 20_000))
        rows.append({"case": "cloudevents.encode only (tracks)", "events/s": enc})

        bare = await bare_durable(url, args.durable, "bare")
        rows.append({"case": "bare js.publish_async + acks", "events/s": bare, "vs bare": 1.0})
        expected_stored = args.durable
        for pending in args.pending:
            res = await publisher_durable(url, args.durable, f"pub{pending}", pending)
            expected_stored += args.durable
            rows.append(
                {
                    "case": f"publisher durable (max_pending_acks={pending})",
                    "events/s": res["events_per_s"],
                    "vs bare": res["events_per_s"] / bare,
                    "ack p50 ms": res["ack_p50_ms"],
                    "ack p99 ms": res["ack_p99_ms"],
                    "lost": args.durable - res["acked"],
                    "dup": res["duplicates"],
                }
            )
            lost_or_dup += args.durable - res["acked"] + res["duplicates"]
        paced_n = min(args.durable, int(args.paced_rate * 3))  # about 3 s
        res = await publisher_durable(url, paced_n, "paced", 1000, rate=args.paced_rate)
        expected_stored += paced_n
        rows.append(
            {
                "case": f"publisher durable paced at {args.paced_rate:g}/s",
                "events/s": res["events_per_s"],
                "ack p50 ms": res["ack_p50_ms"],
                "ack p99 ms": res["ack_p99_ms"],
                "lost": paced_n - res["acked"],
                "dup": res["duplicates"],
            }
        )
        lost_or_dup += paced_n - res["acked"] + res["duplicates"]
        stored = await stored_count(url)
        lost_or_dup += abs(stored - expected_stored)

        bare_core = await bare_live(url, args.live, "barelive")
        rows.append({"case": "bare nc.publish (detections)", "events/s": bare_core, "vs bare": 1.0})
        live = await publisher_live(url, args.live, "live")
        rows.append(
            {
                "case": "publisher live detections (core)",
                "events/s": live["events_per_s"],
                "vs bare": live["events_per_s"] / bare_core,
                "lost": args.live - live["received"],
            }
        )
        lost_or_dup += args.live - live["received"]

    columns = ["case", "events/s", "vs bare", "ack p50 ms", "ack p99 ms", "lost", "dup"]
    print(table(rows, columns))
    print(f"stream messages: {stored} (expected {expected_stored}); detection payload {live['bytes_per_event']} B")
    return {
        "params": {"durable": args.durable, "live": args.live, "pending": args.pending, "paced_rate": args.paced_rate},
        "rows": rows,
        "stream_messages": stored,
        "expected_stream_messages": expected_stored,
        "lost_or_duplicated": lost_or_dup,
        "detection_payload_bytes": live["bytes_per_event"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--durable", type=int, default=20_000, help="durable (tracks) events per case")
    parser.add_argument("--live", type=int, default=50_000, help="live (detections) events")
    parser.add_argument("--pending", type=int, nargs="+", default=[100, 1000], help="max_pending_acks values")
    parser.add_argument("--paced-rate", type=float, default=1000.0, help="durable events/s for the paced case")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(f"wrote {write_results('publisher', result)}")
    return 0 if result["lost_or_duplicated"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
