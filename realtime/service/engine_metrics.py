"""Service-wide metrics of the shared speech recognizer, the compute budget between models and the VLM client."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pipelines.captions.engine import CaptionEngine
from pipelines.compute import ComputeBudget
from pipelines.describe.settings import DescribeEngine


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
        yield CounterMetricFamily(
            "vidsentry_asr_stuck_calls", "Recognizer calls that ran past the stuck deadline", value=stats.stuck_calls
        )
        yield GaugeMetricFamily(
            "vidsentry_asr_oldest_call_seconds", "How long the longest-running recognizer call has run (0: none)",
            value=batcher.oldest_call_s(),
        )


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


class VlmCollector(Collector):
    """The shared VLM client: requests, outcomes, tokens, and each endpoint's circuit."""

    def __init__(self, engine: DescribeEngine) -> None:
        self.client = engine.client

    def collect(self) -> Iterable[Metric]:
        stats = self.client.stats()
        yield CounterMetricFamily("vidsentry_vlm_requests", "VLM requests (descriptions and alert checks)",
                                  value=stats.requests)
        yield CounterMetricFamily("vidsentry_vlm_failures", "VLM requests that failed", value=stats.failed)
        yield CounterMetricFamily("vidsentry_vlm_retries", "VLM request retries", value=stats.retries)
        yield CounterMetricFamily("vidsentry_vlm_timeouts", "VLM requests that timed out", value=stats.timeouts)
        yield GaugeMetricFamily("vidsentry_vlm_in_flight", "VLM requests in flight", value=stats.in_flight)
        tokens = CounterMetricFamily("vidsentry_vlm_tokens", "VLM tokens by kind", labels=["kind"])
        tokens.add_metric(["prompt"], stats.prompt_tokens)
        tokens.add_metric(["cached"], stats.cached_tokens)
        tokens.add_metric(["completion"], stats.completion_tokens)
        yield tokens
        open_ = GaugeMetricFamily(
            "vidsentry_vlm_endpoint_open", "1 while an endpoint's circuit is open (not asked)", labels=["endpoint"]
        )
        for endpoint in stats.endpoints:
            open_.add_metric([endpoint.url], int(endpoint.breaker == "open"))
        yield open_
