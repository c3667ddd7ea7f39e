"""Three `vidsentry serve --fleet` workers on one real nats-server, sharing six streams (a small
clip each worker reads at its own pace, like a camera).

The tests run in order on one fleet (starting workers costs most of the time): spread and
agreement, SIGKILL fail-over, SIGSTOP past the TTL, then a restart of the whole fleet.
Leases: TTL 3 s, renewed every 1 s.
"""

from __future__ import annotations

import collections
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.fleet.fleet_support import TEST_FLEET, EventRecorder, Fleet, Worker, http, poll
from tests.support.chaos import stored_ids

TTL = TEST_FLEET["lease_ttl_s"]
RENEW = TEST_FLEET["renew_interval_s"]
STREAMS = [f"cam{i}" for i in range(6)]
START_S = 6.0  # a stream opening and going live on a busy 2-core box
# A bound against hangs only: how fast a fleet fails over is bench/bench_fleet.py's to measure.
MOVE_S = 3 * (TTL + RENEW + START_S)


@pytest.fixture(scope="module")
def fleet(fleet_nats: EmbeddedNatsServer, nudenet_model: Path, fleet_dir: Path, small_clip: Path) -> Iterator[Fleet]:
    fleet = Fleet(fleet_nats.url, nudenet_model, fleet_dir, local_dirs=[small_clip.parent])
    try:
        fleet.start("w0", "w1", "w2")
        yield fleet
    finally:
        fleet.kill_all()


@pytest.fixture(scope="module")
def recorder(fleet_nats: EmbeddedNatsServer) -> Iterator[EventRecorder]:
    with EventRecorder(fleet_nats.url) as rec:
        yield rec


def owners(worker: Worker) -> dict[str, tuple[str | None, str]]:
    return {sid: (s["owner"], s["state"]) for sid, s in worker.streams().items()}


def all_live(worker: Worker, exclude: str | None = None) -> bool:
    seen = owners(worker)
    return set(seen) >= set(STREAMS) and all(
        seen[sid][1] == "live" and seen[sid][0] not in (None, exclude) for sid in STREAMS
    )


def balanced(worker: Worker, nodes: int) -> bool:
    """Every stream live, spread evenly over `nodes` workers."""
    if not all_live(worker):
        return False
    load = collections.Counter(owner for owner, _ in owners(worker).values())
    return len(load) == nodes and max(load.values()) - min(load.values()) <= 1


def settled(fleet: Fleet, nodes: int) -> bool:
    """Every live worker sees every stream live, spread evenly over `nodes`, and they all list the
    same owners: a worker that stalled a moment may have taken more than its share, handed back
    later, and one worker's view may lag another's."""
    workers = fleet.live()
    if not all(balanced(w, nodes) for w in workers):
        return False
    listings = [owners(w) for w in workers]
    return all(listing == listings[0] for listing in listings)


def lost_leases(worker: Worker) -> float:
    """vidsentry_fleet_leases_total{event="lost"} of `worker` (0 before its first)."""
    found = re.search(r'^vidsentry_fleet_leases_total\{event="lost"\} (\S+)$', http("GET", f"{worker.url}/metrics")[1],
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_streams_added_on_one_worker_run_once_spread_and_every_worker_lists_the_same(
    fleet: Fleet, small_clip: Path, recorder: EventRecorder
) -> None:
    w0 = fleet.workers["w0"]
    for sid in STREAMS:
        status, body = http("POST", f"{w0.url}/api/streams",
                            {"id": sid, "url": str(small_clip), "audio": False, "detect_fps": 1})
        assert status == 201, body
    assert http("POST", f"{w0.url}/api/streams", {"id": "cam0", "url": str(small_clip)})[0] == 409
    poll(lambda: settled(fleet, 3), 30, "every stream live, spread, and listed alike by every worker")
    listings = [owners(w) for w in fleet.live()]
    assert all(set(listing) == set(STREAMS) for listing in listings)
    assert all(listing[sid][0] == listings[0][sid][0] for listing in listings for sid in STREAMS), listings
    load = collections.Counter(owner for owner, _ in listings[0].values())
    assert sorted(load.values()) == [2, 2, 2], load  # even spread
    # Each stream runs on its owner only: its detections come from one node, with one lease revision.
    since = time.time()
    poll(lambda: recorder.detections_since(since, STREAMS, count=2) is not None, 10, "two detections of every stream")
    recent = recorder.detections_since(since, STREAMS) or []
    for sid in STREAMS:
        sources = {(e.node, e.lease) for e in recent if e.stream_id == sid}
        assert len(sources) == 1 and next(iter(sources))[0] == listings[0][sid][0], (sid, sources)
    # /metrics: this worker's load and lease counters.
    text = http("GET", f"{w0.url}/metrics")[1]
    assert 'vidsentry_fleet_streams_owned{node="w0"} 2.0' in text
    assert 'vidsentry_fleet_leases_total{event="acquired"}' in text and "vidsentry_fleet_nodes 3.0" in text


def test_a_killed_workers_streams_go_live_elsewhere_within_the_ttl_and_no_stream_runs_twice(
    fleet: Fleet, recorder: EventRecorder, fleet_nats: EmbeddedNatsServer
) -> None:
    w0, w1 = fleet.workers["w0"], fleet.workers["w1"]
    before = owners(w0)
    moved = [sid for sid, (owner, _) in before.items() if owner == "w1"]
    assert len(moved) == 2
    w1.serve.kill()
    killed_at = time.time()  # judged against the events' own published_at, not when they got here
    took = poll(lambda: all_live(w0, exclude="w1"), MOVE_S, "w1's streams live on w0 or w2")
    after = owners(w0)
    assert all(after[sid][0] in ("w0", "w2") for sid in STREAMS)
    assert {sid for sid in STREAMS if after[sid] != before[sid]} == set(moved)  # the others stayed put
    print(f"fail-over: {took:.1f} s")

    def taken_over(sid: str) -> set[int]:
        return {e.lease or 0 for e in recorder.snapshot() if e.stream_id == sid and e.node == after[sid][0]
                and (e.published_at or 0.0) > killed_at}

    poll(lambda: all(taken_over(sid) for sid in moved), MOVE_S, "events of w1's streams from their new owners")
    events = recorder.snapshot()
    for sid in moved:
        # Nothing from the killed worker published after the kill ...
        late = [e for e in events if e.stream_id == sid and e.node == "w1" and (e.published_at or 0.0) > killed_at]
        assert not late
        # ... and the new owner publishes under a newer lease revision than w1 had.
        old = {e.lease or 0 for e in events if e.stream_id == sid and e.node == "w1"}
        new = taken_over(sid)
        assert old and new and 0 < max(old) < min(new), (sid, old, new)
    ids = stored_ids([fleet_nats.url], within_s=30.0)
    assert ids and len(ids) == len(set(ids))  # durable events: no duplicate ce-id stored


def test_a_worker_paused_past_its_ttl_stops_publishing_as_owner_and_does_not_fight(
    fleet: Fleet, recorder: EventRecorder
) -> None:
    w0, w2 = fleet.workers["w0"], fleet.workers["w2"]
    paused = [sid for sid, (owner, _) in owners(w0).items() if owner == "w2"]
    assert paused
    lost_before = lost_leases(w2)  # its earlier life may have lost leases too
    w2.signal(signal.SIGSTOP)
    try:
        poll(lambda: all_live(w0, exclude="w2"), MOVE_S, "w2's streams live on w0")
    finally:
        resumed_at = time.time()  # judged against the events' own published_at, not when they got here
        w2.signal(signal.SIGCONT)
    old_leases = {e.lease for e in recorder.snapshot() if e.stream_id in paused and e.node == "w2"}
    # Back, w2 gets streams again only by the normal spread (fresh claims handed over by w0), never
    # by renewing what it held before the pause.
    poll(lambda: settled(fleet, 2), 2 * MOVE_S, "every stream live and spread after the pause")
    listing = owners(w2)
    since = time.time()
    poll(lambda: recorder.detections_since(since, STREAMS, count=2) is not None, 10, "two detections of every stream")
    assert owners(w0) == listing  # settled: nobody fights over a stream
    events = recorder.snapshot()
    # Events that passed w2's fence before the pause and went out after it are no fault: only one
    # stamped after the resume would be (a stop between the fence and the stamp aside).
    late = [e for e in events if e.node == "w2" and (e.published_at or 0.0) > resumed_at + 0.5]
    assert not [e for e in late if e.lease in old_leases], "w2 published under a lease it lost"
    # No stream has two publishers now: one node and one lease revision each.
    recent = [e for e in events if e.kind == "detections" and (e.published_at or 0.0) > since]
    for sid in STREAMS:
        sources = {(e.node, e.lease) for e in recent if e.stream_id == sid}
        assert len(sources) == 1 and next(iter(sources))[0] == listing[sid][0], (sid, sources)
    assert lost_leases(w2) == lost_before + len(paused)


def test_a_restarted_fleet_brings_back_the_streams_added_through_the_api(fleet: Fleet) -> None:
    fleet.stop_all()  # SIGTERM: every worker stops its streams and hands its leases back
    workers = fleet.start("w0", "w1", "w2")
    poll(lambda: balanced(workers[1], 3), 30, "the API's streams live again, spread over the three")
