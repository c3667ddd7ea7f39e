"""The CI case of bench/chaos.py: a fleet worker under load on a real 3-node NATS cluster loses the
node it talks to, which also leads the VIDSENTRY stream. Judged from outside (tests/support/chaos.py):
every durable event heard on the wire is stored exactly once, publishing comes back, and the
timeline indexes what was published during the loss. How soon publishing comes back (a stream
leader election, then the publisher) is bench/chaos.py's to measure, not this test's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from realtime.bus.jetstream import STREAM_NAME
from tests.support.chaos import ChaosRig
from tests.support.nats_cluster import NatsCluster, move_stream_leader, start_cluster
from tests.support.rtsp import RtspServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    cluster = start_cluster(tmp_path / "nats")
    try:
        yield cluster
    finally:
        cluster.stop()


async def _lead(urls: list[str], to: str) -> None:
    nc = await nats.connect(urls)
    try:
        await move_stream_leader(nc, STREAM_NAME, to)
    finally:
        await nc.close()


def test_a_killed_nats_node_that_leads_the_stream_loses_and_doubles_no_durable_event(
    cluster: NatsCluster, fall_model: Path, rtsp_server: RtspServer, tmp_path: Path
) -> None:
    (tmp_path / "fleet").mkdir()
    rig = ChaosRig(cluster, fall_model, tmp_path / "fleet", [rtsp_server.url("/vtest")] * 2, workers=1)
    try:
        rig.start()
        rig.wait(lambda: any(s.acked >= 20 for s in rig.sampler.series()), 30, "durable events acked")
        victim = rig.serving_node("vidsentry-publisher@w0")
        asyncio.run(_lead(rig.urls, victim.name))  # the hard case: the worker's node leads the stream

        acked = max(s.acked for s in rig.sampler.series())
        # Down until the worker has stored events without the node (within 20 s), then back.
        report = rig.node_fault("kill", victim, down_s=20.0,
                                down_until=lambda: max(s.acked for s in rig.sampler.series()) >= acked + 10)
        account = rig.account(clips_checked=5)

        measured = report.measured
        assert measured["durable_in_window"] > 0, (measured, report.notes)  # the window saw traffic
        assert (account["lost"], account["duplicated"]) == (0, 0), account
        # That publishing came back is node_fault's down_until above: events stored without the node.
        assert measured["publishing_back_s"] is not None, measured
        print(f"publishing back after {measured['publishing_back_s']} s, "
              f"{measured['publishing_after_leader_s']} s after the new leader")
        assert measured["indexing_back_s"] is not None, measured  # the marker sent at the kill was indexed
        assert account["markers_indexed_once"] == account["markers"], account
        assert not account["clips"].get("bad"), account["clips"]
    finally:
        rig.close()
