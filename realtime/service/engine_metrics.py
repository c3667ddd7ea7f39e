"""Service-wide metrics of the shared speech recognizer and of the CPU turns between models."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pipelines.captions.engine import CaptionEngine
from pipelines.compute import ComputeShares


class RecognizerCollector(Collector):
    def __init__(self, engine: CaptionEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterable[Metric]:
        batcher = self.engine.batcher
        stats = batcher.stats
        yield CounterMetricFamily("vidsentry_asr_calls", "Speech recognizer model calls", value=stats.calls)
        yield CounterMetricFamily(
            "vidsentry_asr_decodes", "Decodes through the recognizer (several streams share a call)", value=stats.items
        )
        yield CounterMetricFamily("vidsentry_asr_failures", "Recognizer calls that raised", value=stats.failures)
        yield CounterMetricFamily("vidsentry_asr_busy_seconds", "Time the recognizer was busy", value=stats.busy_s)
        yield CounterMetricFamily(
            "vidsentry_asr_rejected", "Decodes refused: too many waiting", value=stats.rejected
        )
        yield GaugeMetricFamily("vidsentry_asr_alive", "1 while the shared recognizer serves", value=int(batcher.alive))


class ComputeCollector(Collector):
    def __init__(self, shares: ComputeShares) -> None:
        self.shares = shares

    def collect(self) -> Iterable[Metric]:
        waited = CounterMetricFamily(
            "vidsentry_compute_waits", "Model calls that waited for another model's turn at the CPU", labels=["model"]
        )
        wait_s = CounterMetricFamily(
            "vidsentry_compute_wait_seconds", "Time model calls waited for their turn at the CPU", labels=["model"]
        )
        for name, stats in self.shares.stats.items():
            waited.add_metric([name], stats.waited)
            wait_s.add_metric([name], stats.wait_s)
        yield waited
        yield wait_s
