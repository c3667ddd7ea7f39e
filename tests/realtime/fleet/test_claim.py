"""Claim and shed decisions (pure logic), the fence, and the records' wire form."""

from __future__ import annotations

import asyncio

from pipelines.events import Event, EventKind
from realtime.bus import cloudevents
from realtime.fleet.claim import NodeLoad, fair_share, plan
from realtime.fleet.fence import FencedSink
from realtime.leases.records import NodeRecord, node_key
from tests.support.bodies import any_event

IDS = [f"s{i}" for i in range(6)]


def test_fair_share_is_the_even_spread_rounded_up_within_capacity() -> None:
    assert fair_share(6, 3, capacity=8) == 2
    assert fair_share(7, 3, capacity=8) == 3
    assert fair_share(6, 3, capacity=1) == 1
    assert fair_share(6, 3, capacity=8, slack=1) == 3
    assert fair_share(0, 3, capacity=8) == 0


def test_a_worker_claims_up_to_its_share_and_racing_workers_prefer_different_streams() -> None:
    others = {"b": NodeLoad(0, 8), "c": NodeLoad(0, 8)}
    a = plan(node="a", desired=IDS, owners={}, nodes=others, capacity=8)
    b = plan(node="b", desired=IDS, owners={}, nodes={"a": NodeLoad(0, 8), "c": NodeLoad(0, 8)}, capacity=8)
    assert len(a.claim) == 2 and a.share == 2 and not a.shed
    assert a.claim != b.claim  # rendezvous order: a race over the same stream is the exception


def test_nothing_is_claimed_at_the_share_and_an_orphan_goes_to_any_worker_with_room() -> None:
    owners = {"s0": "a", "s1": "a", "s2": "b", "s3": "b", "s4": "c"}
    nodes = {"b": NodeLoad(2, 8), "c": NodeLoad(1, 1)}  # c is full at its capacity of one
    assert plan(node="a", desired=IDS, owners=owners, nodes=nodes, capacity=8).claim == ()
    late = plan(node="a", desired=IDS, owners=owners, nodes=nodes, capacity=8, orphaned=["s5"])
    assert late.claim == ("s5",)
    assert plan(node="a", desired=IDS, owners=owners, nodes=nodes, capacity=2, orphaned=["s5"]).claim == ()


def test_a_worker_above_its_share_sheds_one_stream_only_when_another_can_take_it() -> None:
    owners = {sid: "a" for sid in IDS}
    room = plan(node="a", desired=IDS, owners=owners, nodes={"b": NodeLoad(0, 8)}, capacity=8)
    assert len(room.shed) == 1 and room.share == 3
    full = plan(node="a", desired=IDS, owners=owners, nodes={"b": NodeLoad(0, 0)}, capacity=8)
    assert full.shed == ()
    alone = plan(node="a", desired=IDS, owners=owners, nodes={}, capacity=8)
    assert alone.shed == () and alone.claim == ()


def test_a_dead_workers_streams_are_shared_by_the_survivors() -> None:
    owners = {"s0": "a", "s1": "a", "s2": "b", "s3": "b"}  # c's s4 and s5 expired
    nodes = {"b": NodeLoad(2, 8)}
    assert len(plan(node="a", desired=IDS, owners=owners, nodes=nodes, capacity=8).claim) == 1


def test_the_fence_passes_events_with_the_lease_token_and_drops_them_once_it_is_gone() -> None:
    got: list[Event] = []
    fenced: list[int] = []

    class Sink:
        async def publish(self, event: Event) -> None:
            got.append(event)

    token: list[int | None] = [41]
    sink = FencedSink(Sink(), lambda: token[0], lambda: fenced.append(1))
    event = any_event(EventKind.STATUS, "cam", {"state": "live"}, pts=None, captured_at=1.7e9)
    asyncio.run(sink.publish(event))
    token[0] = None  # validity ran out
    asyncio.run(sink.publish(event))
    token[0] = 57  # taken again later: a new run, not this one
    asyncio.run(sink.publish(event))
    assert len(got) == 1 and len(fenced) == 2
    body, headers = cloudevents.encode(got[0], "w0", 1.7e9)
    assert headers[cloudevents.LEASE_HEADER] == "41" and b'"lease_revision":41' in body
    _, plain = cloudevents.encode(event, "w0", 1.7e9)
    assert cloudevents.LEASE_HEADER not in plain  # outside a fleet: no extension


def test_node_records_round_trip_and_odd_host_names_make_valid_keys() -> None:
    record = NodeRecord("host.example", 4, False, {"cam": "live"})
    assert NodeRecord.decode(record.encode()) == record and record.streams == 1
    assert NodeRecord.decode(b"not json") is None
    assert node_key("host.example:1") == "node.host_example_1"
