"""Read back what JetStream stored, through a consumer over VIDSENTRY, and check it against
what was produced: every durable event exactly once, in production order per stream."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from realtime.bus.jetstream import STREAM_NAME


@dataclass(frozen=True)
class Stored:
    seq: int  # JetStream stream sequence
    stream_id: str
    kind: str
    event_id: str


async def stored_events(url: str) -> list[Stored]:
    """Everything in VIDSENTRY, in stream order, via an ephemeral pull consumer."""
    nc = await nats.connect(url, connect_timeout=5)
    try:
        js = nc.jetstream()
        total = (await js.stream_info(STREAM_NAME)).state.messages
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE)
        sub = await js.pull_subscribe("vidsentry.>", stream=STREAM_NAME, config=config)
        out: list[Stored] = []
        while len(out) < total:
            for msg in await sub.fetch(batch=min(1000, total - len(out)), timeout=5):
                _, stream_id, kind = msg.subject.split(".")
                out.append(Stored(msg.metadata.sequence.stream, stream_id, kind, (msg.headers or {})["ce-id"]))
        await sub.unsubscribe()
        return sorted(out, key=lambda s: s.seq)
    finally:
        await nc.close()


def assert_exactly_once_in_order(stored: list[Stored], produced: dict[str, list[str]]) -> None:
    """`produced`: stream id -> durable event ids in the order publish() was called."""
    duplicates = [event_id for event_id, n in Counter(s.event_id for s in stored).items() if n > 1]
    assert not duplicates, f"{len(duplicates)} events stored more than once, e.g. {duplicates[:3]}"
    per_stream: dict[str, list[str]] = defaultdict(list)
    for s in stored:
        per_stream[s.stream_id].append(s.event_id)
    assert set(per_stream) == set(produced), "streams stored differ from streams produced"
    for stream_id, expected in produced.items():
        got = per_stream[stream_id]
        missing = set(expected) - set(got)
        assert not missing, f"{stream_id}: {len(missing)} of {len(expected)} events never stored"
        assert len(got) == len(expected), f"{stream_id}: {len(got) - len(expected)} unexpected events stored"
        if got != expected:
            first = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
            raise AssertionError(f"{stream_id}: out of order from position {first}: {got[first : first + 3]}")
