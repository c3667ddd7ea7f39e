"""Disk outbox: how fast durable events queue while NATS is down, and how fast they drain after.

Against a real embedded nats-server (JetStream, file store) on loopback:
  append            Outbox.append of pre-encoded tracks events (fsync every 1 s, the default)
  take + remove     reading them back and removing them, without a broker (the disk side of replay)
  spool (publish)   NatsEventPublisher.publish while the broker is down: encode + append
  replay            after the restart: time from reconnect to an empty outbox (every event acked),
                    for `--events` queued events; as events/s next to a bare js.publish_async of
                    the same bytes in the same run (the ratio is what travels between machines)
plus lost / duplicated events in the stream (both must be 0).

Usage: python bench/bench_outbox.py [--events 10000] [--pending 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import table, write_results
from bench_publisher import track_event

from pipelines.events import EventKind
from realtime.bus.cloudevents import encode, subject_for
from realtime.bus.delivery import WireMessage
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import STREAM_NAME
from realtime.bus.outbox import Outbox
from realtime.bus.publisher import NatsEventPublisher


def wire_messages(n: int, stream_id: str) -> list[WireMessage]:
    out = []
    for i in range(n):
        ev = track_event(i, stream_id)
        payload, headers = encode(ev, "bench", time.time())
        out.append(WireMessage(ev.id, EventKind.TRACKS, subject_for(ev), payload, headers, time.monotonic()))
    return out


def outbox_only(directory: Path, messages: list[WireMessage]) -> dict[str, float]:
    with Outbox(directory) as outbox:
        start = time.perf_counter()
        for msg in messages:
            outbox.append(msg)
        append_s = time.perf_counter() - start
        start = time.perf_counter()
        while records := outbox.take(256):
            for record in records:
                outbox.remove(record.seq)
        drain_s = time.perf_counter() - start
    return {"append": len(messages) / append_s, "take_remove": len(messages) / drain_s}


async def bare_publish(url: str, messages: list[WireMessage]) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=4000)
    try:
        start = time.perf_counter()
        for msg in messages:
            await js.publish_async(msg.subject, msg.payload, headers=dict(msg.headers))
        await js.publish_async_completed()
        return len(messages) / (time.perf_counter() - start)
    finally:
        await nc.close()


async def stored_ids(url: str, stream_id: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE)
        sub = await js.pull_subscribe(f"vidsentry.{stream_id}.>", stream=STREAM_NAME, config=config)
        ids: list[str] = []
        while True:
            try:
                msgs = await sub.fetch(batch=2000, timeout=0.5)
            except TimeoutError:  # nothing more stored (nats-py raises either TimeoutError here)
                break
            ids += [(m.headers or {})["ce-id"] for m in msgs]
        await sub.unsubscribe()
        return ids
    finally:
        await nc.close()


async def poll(predicate: Callable[[], bool], step: float = 0.001) -> None:
    """Wait until predicate() holds, checking every `step` s (the timing resolution)."""
    while True:
        if predicate():
            return
        await asyncio.sleep(step)


async def outage_round(
    server: EmbeddedNatsServer, box_dir: Path, n: int, pending: int, stream_id: str
) -> dict[str, Any]:
    events = [track_event(i, stream_id) for i in range(n)]
    pub = NatsEventPublisher(
        server.url, node="bench", reconnect_wait=0.05, max_pending_acks=pending, outbox=Outbox(box_dir)
    )
    await pub.connect()
    try:
        server.kill()
        await poll(lambda: not pub.connected)
        start = time.perf_counter()
        for ev in events:
            await pub.publish(ev)
        spool_s = time.perf_counter() - start
        queued = pub.stats.outbox_depth

        server.restart()
        await poll(lambda: pub.connected)
        reconnected = time.perf_counter()
        await poll(lambda: pub.stats.outbox_depth == 0)
        recovery_s = time.perf_counter() - reconnected
        stats = pub.stats
    finally:
        await pub.close()
    ids = await stored_ids(server.url, stream_id)
    expected = {ev.id for ev in events}
    lost = len(expected - set(ids))
    duplicated = sum(c - 1 for c in Counter(ids).values())
    in_order = ids == [ev.id for ev in events]
    return {
        "spool_per_s": n / spool_s,
        "queued": queued,
        "recovery_s": recovery_s,
        "replay_per_s": n / recovery_s,
        "lost": lost,
        "duplicated": duplicated,
        "in_order": in_order,
        "failed": stats.totals().failed,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        disk = [outbox_only(root / f"disk{i}", wire_messages(args.events, "disk")) for i in range(args.repeat)]
        with EmbeddedNatsServer(store_dir=root / "store") as server:
            async with NatsEventPublisher(server.url, node="bench"):  # creates the stream
                pass
            bare = []
            rounds = []
            for i in range(args.repeat):  # interleaved, so both see the same machine
                bare.append(await bare_publish(server.url, wire_messages(args.events, f"bare{i}")))
                rounds.append(await outage_round(server, root / f"box{i}", args.events, args.pending, f"out{i}"))

    def med(values: list[float]) -> float:
        return float(statistics.median(values))

    bare_rate = med(bare)
    replay_rate = med([r["replay_per_s"] for r in rounds])
    rows = [
        {"case": "Outbox.append (pre-encoded)", "events/s": med([d["append"] for d in disk])},
        {"case": "Outbox.take + remove (no broker)", "events/s": med([d["take_remove"] for d in disk])},
        {"case": "publish() while disconnected (spool)", "events/s": med([r["spool_per_s"] for r in rounds])},
        {"case": "bare js.publish_async + acks", "events/s": bare_rate, "vs bare": 1.0},
        {
            "case": f"replay after reconnect ({args.events} queued)",
            "events/s": replay_rate,
            "vs bare": replay_rate / bare_rate,
            "recovery s": med([r["recovery_s"] for r in rounds]),
        },
    ]
    lost = sum(r["lost"] for r in rounds)
    duplicated = sum(r["duplicated"] for r in rounds)
    in_order = all(r["in_order"] for r in rounds)
    print(table(rows, ["case", "events/s", "vs bare", "recovery s"]))
    print(
        f"median of {args.repeat} rounds; recovery = reconnect -> outbox empty for {args.events} events; "
        f"lost={lost} duplicated={duplicated} in_order={in_order}"
    )
    return {
        "params": {"events": args.events, "pending": args.pending, "repeat": args.repeat},
        "rows": rows,
        "rounds": rounds,
        "lost": lost,
        "duplicated": duplicated,
        "in_order": in_order,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000, help="events queued during the outage")
    parser.add_argument("--pending", type=int, default=1000, help="max_pending_acks (the replay window)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the table shows medians")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(f"wrote {write_results('outbox', result)}")
    return 0 if result["lost"] == 0 and result["duplicated"] == 0 and result["in_order"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
