"""The timeline in a fleet of two `vidsentry serve` processes on one real nats-server: one worker
indexes (it holds the `timeline` lease), both answer searches (the other forwards them over NATS).
The indexing worker is SIGKILLed: the lease moves within the TTL, the survivor's index catches up
from JetStream, and every event is found exactly once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from tests.realtime.fleet.fleet_support import TEST_FLEET, Fleet, Worker, http, poll
from tests.realtime.timeline.bodies import caption

MARK = "timelinemark"
TTL = TEST_FLEET["lease_ttl_s"]


@pytest.fixture(scope="module")
def fleet(fleet_nats: EmbeddedNatsServer, nudenet_model: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Fleet]:
    fleet = Fleet(fleet_nats.url, nudenet_model, tmp_path_factory.mktemp("timeline-fleet"), name="tl")
    try:
        fleet.start("w0", "w1")
        yield fleet
    finally:
        fleet.kill_all()


def publish(url: str, first: int, count: int) -> set[str]:
    async def send() -> set[str]:
        ids = set()
        async with NatsEventPublisher(url, node="elsewhere") as publisher:
            now = time.time()
            for n in range(first, first + count):
                event = caption(f"cam{n % 3}", f"seg{n}", f"{MARK} number{n} was said here.", float(n) * 10, at=now)
                ids.add(event.id)
                await publisher.publish(event)
            assert await publisher.flush(10)
        return ids

    return asyncio.run(send())


def found(worker: Worker) -> tuple[list[str], dict[str, Any]]:
    status, body = http("GET", f"{worker.url}/api/search?q={MARK}&limit=100&order=newest")
    if status != 200:
        return [], {"status": status, "body": body}
    return [h["event_id"] for h in body["hits"]], body["index"]


def test_one_worker_indexes_both_answer_and_a_killed_indexer_loses_and_doubles_nothing(
    fleet: Fleet, fleet_nats: EmbeddedNatsServer
) -> None:
    w0, w1 = fleet.workers["w0"], fleet.workers["w1"]
    sent = publish(fleet_nats.url, 0, 30)
    for worker in (w0, w1):
        poll(lambda w=worker: sorted(found(w)[0]) == sorted(sent), 20, f"{worker.name} to find all 30")
    holders = {found(w)[1]["node"] for w in (w0, w1)}
    assert len(holders) == 1, holders  # both answers came from the one index
    holder = fleet.workers[holders.pop()]
    survivor = w1 if holder is w0 else w0

    holder.serve.kill()
    sent |= publish(fleet_nats.url, 30, 30)  # published while nobody indexes
    poll(lambda: sorted(found(survivor)[0]) == sorted(sent), TTL + 20, "the survivor to index everything")
    ids, index = found(survivor)
    assert index["node"] == survivor.name  # the lease moved: the survivor indexes now
    assert len(ids) == len(set(ids)) == 60, "an event is missing or doubled"
    assert fleet.story("this worker now indexes the fleet's timeline").count(f"{survivor.name}-") == 1
    status, metrics = http("GET", f"{survivor.url}/metrics")
    assert status == 200 and "vidsentry_timeline_entries 60.0" in metrics
