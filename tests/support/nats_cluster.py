"""A real 3-node NATS cluster with JetStream on loopback, for tests that lose a broker node.

Each node is an `EmbeddedNatsServer` (so `kill()` / `restart()` keep its port and store) with a
config file naming it and routing to the others on free local ports; each has its own store and
monitoring port. `start_cluster` returns once every node reports JetStream healthy and the
cluster has elected a meta leader, i.e. once a stream with replicas 3 can be created.

    from tests.support.nats_cluster import nats_cluster  # noqa: F401   (in a conftest.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors
import pytest
from nats.aio.client import Client as NatsClient

from realtime.bus.embedded import EmbeddedNatsServer, free_port

CLUSTER_NAME = "vidsentry-test"
_READY_TIMEOUT_S = 20.0
_POLL_S = 0.05


@dataclass
class ClusterNode:
    name: str
    server: EmbeddedNatsServer
    monitor_port: int

    @property
    def url(self) -> str:
        return self.server.url

    def monitor(self, path: str) -> dict[str, Any] | None:
        """A monitoring endpoint's JSON, or None while the node does not answer (or says it is unwell)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}{path}", timeout=1) as reply:
                body: dict[str, Any] = json.load(reply)
                return body
        except (OSError, urllib.error.URLError, ValueError):
            return None


class NatsCluster:
    def __init__(self, nodes: list[ClusterNode]) -> None:
        self.nodes = nodes

    @property
    def url(self) -> str:
        """Every node, comma-separated: what a client is configured with (`nats.url`)."""
        return ",".join(node.url for node in self.nodes)

    def node(self, name: str) -> ClusterNode:
        return next(node for node in self.nodes if node.name == name)

    def node_on_port(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.server.port == port)

    def meta_leader(self) -> str | None:
        """The meta leader's server name as a running node sees it (None during an election)."""
        for node in self.nodes:
            if node.server.running:
                leader = (self._meta(node) or {}).get("leader")
                if leader:
                    return str(leader)
        return None

    def _meta(self, node: ClusterNode) -> dict[str, Any] | None:
        jsz = node.monitor("/jsz") or {}
        meta: dict[str, Any] | None = jsz.get("meta_cluster")
        return meta

    def _settled(self) -> bool:
        """Every running node is healthy and the meta leader, itself running, sees each of them current."""
        running = [node for node in self.nodes if node.server.running]
        if not all(node.monitor("/healthz") is not None for node in running):
            return False
        leader_name = self.meta_leader()
        leader = next((node for node in running if node.name == leader_name), None)
        meta = self._meta(leader) if leader is not None else None
        if meta is None or meta.get("leader") != leader_name:
            return False
        current = {peer["name"] for peer in meta.get("replicas") or [] if peer.get("current")}
        return {node.name for node in running} - {leader_name} <= current

    def wait_ready(self, timeout: float = _READY_TIMEOUT_S) -> None:
        """Until the running nodes have a meta leader that every one of them follows (streams can be
        created and scaled), e.g. after start or after a node was killed or restarted."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._settled():
                return
            time.sleep(_POLL_S)
        tails = "\n".join(f"--- {node.name}\n{node.server.log_tail(800)}" for node in self.nodes)
        raise RuntimeError(f"NATS cluster not ready within {timeout:g} s:\n{tails}")

    def stop(self) -> None:
        for node in self.nodes:
            node.server.stop()


async def move_stream_leader(nc: NatsClient, stream: str, to: str, within_s: float = 10.0) -> int:
    """Make server `to` the leader of JetStream stream `stream` (a KV bucket is stream KV_<bucket>),
    e.g. so that killing that server also loses the leader; returns the stream's replica count."""
    js = nc.jetstream()
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(nats.errors.Error):  # no leader for a moment during a hand-over
            info = await js.stream_info(stream)
            leader = info.cluster.leader if info.cluster is not None else None
            if leader == to:
                return int(info.config.num_replicas or 1)
            if leader is not None:
                request = json.dumps({"placement": {"preferred": to}}).encode()
                await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", request, timeout=5)
        await asyncio.sleep(0.1)
    raise AssertionError(f"the leader of {stream} did not move to {to} within {within_s:g} s")


def start_cluster(base_dir: Path, size: int = 3) -> NatsCluster:
    """`size` nats-server processes routed to each other, each with its own store under base_dir."""
    route_ports = [free_port() for _ in range(size)]
    routes = ", ".join(f"nats://127.0.0.1:{port}" for port in route_ports)
    nodes = []
    for i, route_port in enumerate(route_ports):
        name = f"n{i + 1}"
        node_dir = base_dir / name
        node_dir.mkdir(parents=True, exist_ok=True)
        monitor_port = free_port()
        config = node_dir / "nats.conf"
        # Client address, -js and the store come from EmbeddedNatsServer's flags.
        config.write_text(
            f"server_name: {name}\n"
            f"http: 127.0.0.1:{monitor_port}\n"
            f"cluster {{\n  name: {CLUSTER_NAME}\n  listen: 127.0.0.1:{route_port}\n  routes: [{routes}]\n}}\n"
        )
        server = EmbeddedNatsServer(store_dir=node_dir / "store", config_file=config)
        nodes.append(ClusterNode(name, server, monitor_port))
    cluster = NatsCluster(nodes)
    try:
        for node in nodes:
            node.server.start()
        cluster.wait_ready()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    cluster = start_cluster(tmp_path / "nats-cluster")
    try:
        yield cluster
    finally:
        cluster.stop()
