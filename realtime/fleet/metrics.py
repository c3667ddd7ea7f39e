"""`/metrics` for a fleet worker: its load and share, the fleet it sees, and lease counters."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from realtime.fleet.worker import FleetWorker


class FleetCollector(Collector):
    def __init__(self, worker: FleetWorker) -> None:
        self.worker = worker

    def collect(self) -> Iterable[Metric]:
        worker = self.worker
        keeper = worker.keeper
        node = [worker.node]
        load = GaugeMetricFamily("vidsentry_fleet_streams_owned", "Streams whose lease this worker holds",
                                 labels=["node"])
        load.add_metric(node, len(keeper) if keeper is not None else 0)
        yield load
        capacity = GaugeMetricFamily("vidsentry_fleet_capacity", "Streams this worker runs at most", labels=["node"])
        capacity.add_metric(node, worker.capacity)
        yield capacity
        share = GaugeMetricFamily("vidsentry_fleet_share", "This worker's fair share of the desired streams now",
                                  labels=["node"])
        share.add_metric(node, worker.share)
        yield share
        yield GaugeMetricFamily("vidsentry_fleet_nodes", "Live workers this worker sees, itself included",
                                value=worker.live_nodes())
        yield GaugeMetricFamily("vidsentry_fleet_desired_streams", "Streams in the fleet's desired set",
                                value=worker.desired_count)
        leases = CounterMetricFamily("vidsentry_fleet_leases", "Lease events on this worker", labels=["event"])
        if keeper is not None:
            c = keeper.counters
            for name, value in (("acquired", c.acquired), ("renewed", c.renewed), ("lost", c.lost),
                                ("released", c.released), ("contended", c.contended), ("failed", c.errors)):
                leases.add_metric([name], value)
        yield leases
        refused = CounterMetricFamily("vidsentry_fleet_desired_values_skipped",
                                      "Desired-bucket values this worker will not run, once per key and revision",
                                      labels=["why"])
        refused.add_metric(["policy"], worker.desired.counts.refused)
        refused.add_metric(["unreadable"], worker.desired.counts.skipped)
        yield refused
        yield CounterMetricFamily("vidsentry_fleet_duplicate_node_records",
                                  "Records of this worker's node name written by another worker (shared --node)",
                                  value=worker.counters.duplicate_nodes)
        yield CounterMetricFamily("vidsentry_fleet_watch_stalls",
                                  "Bucket watches started again because this worker's own write never came through",
                                  value=worker.watch_stalls)
        yield CounterMetricFamily("vidsentry_fleet_fenced_events",
                                  "Events dropped because this worker's lease on the stream was not valid",
                                  value=worker.counters.fenced_events)
