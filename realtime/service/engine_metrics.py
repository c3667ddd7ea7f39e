"""Service-wide metrics of the capabilities' shared engines and of the compute budget between models."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pipelines.capabilities import samples
from pipelines.capability import Sample
from pipelines.compute import ComputeBudget


class SampleCollector(Collector):
    """Samples (pipelines.capability.Sample) read at every scrape, as metric families."""

    def __init__(self, read: Callable[[], Iterable[Sample]]) -> None:
        self.read = read

    def collect(self) -> Iterable[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for sample in self.read():
            family = families.get(sample.name)
            if family is None:
                kind = CounterMetricFamily if sample.kind == "counter" else GaugeMetricFamily
                family = families[sample.name] = kind(sample.name, sample.help, labels=[k for k, _ in sample.labels])
            family.add_metric([v for _, v in sample.labels], sample.value)
        yield from families.values()


def capability_collector(opened: Mapping[str, object]) -> SampleCollector:
    """What each open capability's engine reports."""
    return SampleCollector(lambda: samples(opened))


class ComputeCollector(Collector):
    """The compute budget's decisions: each model's part of the cores, its waits and wide calls."""

    def __init__(self, budget: ComputeBudget) -> None:
        self.budget = budget

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("vidsentry_compute_cores", "Thread slots the compute budget hands out",
                                value=self.budget.cores)
        yield GaugeMetricFamily("vidsentry_compute_threads_in_use", "Thread slots held by model calls now",
                                value=self.budget.threads_in_use())
        share = GaugeMetricFamily(
            "vidsentry_compute_busy_share", "A model's part of the cores' recent time (decayed, 0-1)", labels=["model"]
        )
        for name, value in self.budget.busy_shares().items():
            share.add_metric([name], value)
        yield share
        families = {
            "turns": CounterMetricFamily("vidsentry_compute_turns", "Model calls the budget let run", labels=["model"]),
            "waited": CounterMetricFamily(
                "vidsentry_compute_waits", "Model calls that waited for threads", labels=["model"]
            ),
            "wait_s": CounterMetricFamily(
                "vidsentry_compute_wait_seconds", "Time model calls waited for threads", labels=["model"]
            ),
            "thread_s": CounterMetricFamily(
                "vidsentry_compute_thread_seconds", "Thread-seconds model calls held", labels=["model"]
            ),
        }
        for name, stats in self.budget.stats.items():
            for key, family in families.items():
                family.add_metric([name], getattr(stats, key))
        yield from families.values()
