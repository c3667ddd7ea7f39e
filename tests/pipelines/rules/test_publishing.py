"""AlertPublisher: snapshots in the background, bounded, never losing or reordering an alert."""

from __future__ import annotations

import asyncio

import cv2
import numpy as np
import pytest

from pipelines.clock import Moment
from pipelines.frames import VideoFrame
from pipelines.rules.publishing import AlertPublisher
from pipelines.rules.types import AlertChange
from tests.pipelines.rules.script import engine, person
from tests.support.sinks import ListSink

FRAME = VideoFrame("cam", 7, 1.0, 1e9, np.full((48, 64, 3), (200, 30, 30), np.uint8))


class RuleSink(ListSink):
    def bodies(self) -> list[tuple[str, str, str | None]]:
        return [(e.data["rule_id"], e.data["event"], e.data["snapshot"]) for e in self.events]


class GatedStore:
    """Holds every put until `gate` is set (or fails, when `fail` is set)."""

    def __init__(self, *, fail: bool = False) -> None:
        self.gate = asyncio.Event()
        self.fail = fail
        self.puts: list[tuple[str, bytes]] = []

    async def put(self, key: str, jpeg: bytes) -> str:
        self.puts.append((key, jpeg))
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("object store unavailable")
        return f"nats-object://snaps/{key}"


def instant_alerts() -> tuple[list[AlertChange], list[AlertChange]]:
    """Two rules firing on one frame (one wants a snapshot) and, a frame later, both ending."""
    eng = engine(
        {"id": "shot", "type": "present", "snapshot": True, "clear_s": 0},
        {"id": "plain", "type": "present", "clear_s": 0},
    )
    return (
        eng.evaluate(Moment(1.0, 1.0), [person(1, 30, 40, height=20)]),
        eng.evaluate(Moment(1.1, 1.1), [], ended=[1]),
    )


async def test_start_waits_for_its_snapshot_and_its_end_queues_behind_it() -> None:
    sink, store = RuleSink(), GatedStore()
    first, second = instant_alerts()
    async with asyncio.TaskGroup() as tasks:
        publisher = AlertPublisher("cam", sink, tasks, store)
        await publisher.publish(first, captured_at=FRAME.captured_at, frame=FRAME)
        await publisher.publish(second, captured_at=FRAME.captured_at + 0.1)
        # The frame loop was not held up: the alert without a snapshot is already out.
        assert sink.bodies() == [("plain", "start", None), ("plain", "end", None)]
        assert publisher.in_flight == 1
        store.gate.set()
    reference = "nats-object://snaps/cam/" + first[0].alert_id + ".jpg"
    assert sink.bodies()[2:] == [("shot", "start", reference), ("shot", "end", reference)]
    key, jpeg = store.puts[0]
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == (48, 64, 3) and abs(int(image[0, 0, 2]) - 200) < 8  # RGB red is BGR's last
    assert publisher.stats.snapshots_stored == 1 and publisher.stats.started == 2 and publisher.stats.ended == 2


async def test_a_failing_store_costs_only_the_picture() -> None:
    sink, store = RuleSink(), GatedStore(fail=True)
    store.gate.set()
    first, second = instant_alerts()
    async with asyncio.TaskGroup() as tasks:
        publisher = AlertPublisher("cam", sink, tasks, store)
        await publisher.publish(first, captured_at=1e9, frame=FRAME)
        await publisher.publish(second, captured_at=1e9)
    assert sorted(sink.bodies()) == sorted(
        [("plain", "start", None), ("plain", "end", None), ("shot", "start", None), ("shot", "end", None)]
    )
    assert publisher.stats.snapshots_failed == 1 and publisher.stats.snapshots_stored == 0


async def test_a_slow_store_times_out_and_the_alert_goes_out() -> None:
    sink, store = RuleSink(), GatedStore()  # never opens
    first, _ = instant_alerts()
    async with asyncio.TaskGroup() as tasks:
        publisher = AlertPublisher("cam", sink, tasks, store, timeout_s=0.05)
        await publisher.publish(first, captured_at=1e9, frame=FRAME)
    assert ("shot", "start", None) in sink.bodies() and publisher.stats.snapshots_failed == 1


@pytest.mark.parametrize("with_store", [True, False])
async def test_over_the_bound_or_without_a_store_the_snapshot_is_skipped(with_store: bool) -> None:
    sink, store = RuleSink(), GatedStore()
    async with asyncio.TaskGroup() as tasks:
        publisher = AlertPublisher("cam", sink, tasks, store if with_store else None, max_in_flight=1)
        for _ in range(3):
            first, _ = instant_alerts()  # a fresh engine each time: three separate alerts
            await publisher.publish(first, captured_at=1e9, frame=FRAME)
        store.gate.set()
    starts = [b for b in sink.bodies() if b[0] == "shot"]
    assert len(starts) == 3
    stored = 1 if with_store else 0
    assert sum(b[2] is not None for b in starts) == stored
    assert publisher.stats.snapshots_skipped == 3 - stored and len(store.puts) == stored
