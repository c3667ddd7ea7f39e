"""A 3-node NATS cluster (real nats-server processes on loopback) loses a node mid-run.

The publisher is configured with every node (`nats.url` as a list) and `nats.replicas: 3`. The
node it is connected to, which is also made the VIDSENTRY stream's leader, is SIGKILLed while
three streams publish: the publisher reconnects to a surviving node, the stream elects a new
leader, the outbox re-sends what was unanswered with the same Nats-Msg-Id, and every durable
event is stored exactly once, in order. The killed node then comes back and catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
from nats.js.client import JetStreamContext

from pipelines.events import Event, EventKind
from realtime.bus.delivery import WireMessage
from realtime.bus.jetstream import STREAM_NAME
from realtime.bus.outbox import Outbox
from realtime.bus.publisher import NatsEventPublisher
from tests.support.nats_cluster import NatsCluster, move_stream_leader, nats_cluster  # noqa: F401
from tests.support.waiting import wait_until

from .jetstream_log import Stored, assert_exactly_once_in_order, stored_events
from .util import camera, event

pytestmark = pytest.mark.timeout(60)

STREAMS = ("gate", "lobby", "yard")
RATE_PER_STREAM = 30.0  # durable events per second, each stream


class AckLog:
    """DeliveryHooks that remembers what JetStream acknowledged, and how often it said duplicate."""

    def __init__(self) -> None:
        self.acked: set[str] = set()
        self.duplicates = 0
        self.undeliverable: list[str] = []

    def on_acked(self, msg: WireMessage, delay_s: float, duplicate: bool) -> None:
        self.acked.add(msg.event_id)
        self.duplicates += duplicate

    def on_undeliverable(self, msg: WireMessage, error: BaseException) -> None:
        self.undeliverable.append(f"{msg.event_id}: {error!r}")


def next_event(stream: str, i: int) -> Event:
    if i % 10 == 0:
        return event(EventKind.ALERTS, stream, rule="loiter", phase="start", severity="warning")
    return event(EventKind.TRACKS, stream, track_id=i % 7, phase="update")


def cluster_publisher(cluster: NatsCluster, acks: AckLog, tmp_path: Path,
                      ack_timeout: float = 2.0) -> NatsEventPublisher:
    """A publisher on the whole cluster (R3 stream), quick to reconnect, its acks noted in `acks`."""
    return NatsEventPublisher(
        cluster.url,
        node="test",
        stream_replicas=3,
        reconnect_wait=0.25,
        ack_timeout=ack_timeout,
        hooks=acks,
        outbox=Outbox(tmp_path / "outbox", fsync_interval_s=None),
    )


async def stream_leader(js: JetStreamContext) -> str | None:
    info = await js.stream_info(STREAM_NAME)
    return info.cluster.leader if info.cluster is not None else None


async def test_losing_a_nats_node_loses_and_duplicates_no_durable_event(
    nats_cluster: NatsCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    acks = AckLog()
    pub = cluster_publisher(nats_cluster, acks, tmp_path)
    await pub.connect()
    produced: dict[str, list[str]] = {stream: [] for stream in STREAMS}
    stop = asyncio.Event()
    try:
        assert pub.nc is not None and pub.nc.connected_url is not None
        js = pub.nc.jetstream()
        info = await js.stream_info(STREAM_NAME)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2
        victim = nats_cluster.node_on_port(pub.nc.connected_url.port or 0)
        await move_stream_leader(pub.nc, STREAM_NAME, victim.name)

        async with asyncio.TaskGroup() as tg:
            for stream in STREAMS:
                paced = camera(
                    pub, stream, stop, produced[stream], rate=RATE_PER_STREAM, next_event=next_event
                )
                tg.create_task(paced, name=f"camera-{stream}")
            await wait_until(lambda: len(acks.acked) >= 60, within_s=10, what="events acked before the kill")
            victim.server.kill()
            await wait_until(lambda: pub.stats.reconnects >= 1, within_s=15, what="publisher reconnected")
            assert pub.nc.connected_url.port != victim.server.port
            acked_at_kill = len(acks.acked)
            await wait_until(
                lambda: len(acks.acked) > acked_at_kill + 60,
                within_s=20,
                what=lambda: f"events acked after the kill ({len(acks.acked) - acked_at_kill}) {pub.stats}",
            )
            stop.set()
        assert await pub.flush(20), pub.stats

        survivors_leader = await stream_leader(js)
        assert survivors_leader is not None and survivors_leader != victim.name
        # The node comes back from its store and catches up; the stream has its three copies again.
        await asyncio.to_thread(victim.server.restart)
        await asyncio.to_thread(nats_cluster.wait_ready)

        stored = await read_when_settled(victim.url)  # read through the node that was down
        assert_exactly_once_in_order(stored, produced)
        assert {s.event_id for s in stored} >= acks.acked  # nothing acknowledged went missing
        totals = pub.stats.totals()
        assert not acks.undeliverable and totals.failed == 0
        # Each counted once, whichever way: an event whose ack was lost in the kill is sent again
        # and acked as a duplicate, and that one ack is all it gets.
        assert totals.acked == sum(map(len, produced.values())) and totals.duplicates == acks.duplicates
        assert pub.stats.outbox_depth == 0
    finally:
        stop.set()
        await pub.close()


async def read_when_settled(url: str, limit_s: float = 30.0) -> list[Stored]:
    """What VIDSENTRY holds, read through `url`. A node just back answers consumer requests with
    503 until it has caught up with the others: retried, as any client would."""
    deadline = asyncio.get_running_loop().time() + limit_s
    while True:
        try:
            return await stored_events(url)
        except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_a_frozen_nats_node_is_left_for_another_within_seconds(
    nats_cluster: NatsCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    """SIGSTOP the node the publisher talks to: the TCP connection stays up and says nothing, so
    nats-py's own pings (every 20 s, three missed) would keep it there for a minute or more while
    every durable event waits. Sends that go a second with no ack make the link ping the server,
    without waiting for an ack to time out (here 30 s: longer than the test waits); a server that
    does not answer either is left for another node of the list, and publishing goes on."""
    acks = AckLog()
    pub = cluster_publisher(nats_cluster, acks, tmp_path, ack_timeout=30.0)
    await pub.connect()
    produced: dict[str, list[str]] = {stream: [] for stream in STREAMS}
    stop = asyncio.Event()
    assert pub.nc is not None and pub.nc.connected_url is not None
    frozen = nats_cluster.node_on_port(pub.nc.connected_url.port or 0)
    assert frozen.server.pid is not None
    try:
        async with asyncio.TaskGroup() as tg:
            for stream in STREAMS:
                paced = camera(pub, stream, stop, produced[stream], rate=RATE_PER_STREAM, next_event=next_event)
                tg.create_task(paced, name=f"camera-{stream}")
            await wait_until(lambda: len(acks.acked) >= 60, within_s=10, what="events acked before the freeze")
            os.kill(frozen.server.pid, signal.SIGSTOP)
            acked_at_freeze = len(acks.acked)
            # A second of silence + one ping (2 s), with room for a loaded machine: below the ack
            # timeout, and far below the minute and more nats-py's own pings take.
            await wait_until(lambda: pub.stats.reconnects >= 1, within_s=15,
                             what=lambda: f"publisher left the frozen node {pub.stats}")
            assert pub.nc.connected_url.port != frozen.server.port
            assert pub.stats.silence_pings >= 1
            await wait_until(
                lambda: len(acks.acked) > acked_at_freeze + 60,
                within_s=20,
                what=lambda: f"events acked on another node ({len(acks.acked) - acked_at_freeze}) {pub.stats}",
            )
            stop.set()
        assert await pub.flush(20), pub.stats
        os.kill(frozen.server.pid, signal.SIGCONT)
        await asyncio.to_thread(nats_cluster.wait_ready)
        survivor = next(node for node in nats_cluster.nodes if node is not frozen)
        stored = await read_when_settled(survivor.url)
        assert_exactly_once_in_order(stored, produced)
        assert {s.event_id for s in stored} >= acks.acked
        assert not acks.undeliverable and pub.stats.totals().failed == 0
    finally:
        stop.set()
        with contextlib.suppress(ProcessLookupError):
            os.kill(frozen.server.pid, signal.SIGCONT)
        await pub.close()
