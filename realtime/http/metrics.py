"""Prometheus metrics for `vidsentry serve`.

Counters and gauges are read from the stats the parts already keep (streams, publisher,
batcher, SSE fan-out) at scrape time by one custom collector, so nothing is counted twice
and the hot path pays nothing for them. Only the two latency histograms are fed per frame,
by the frame loop's `on_frame` observer. Frame rates come from a sampler that reads the
frame counters once a second and keeps a short window per stream.

Each service has its own CollectorRegistry, so several services in one process (tests)
never collide, and a deleted stream's labels are removed so churn cannot grow them.

A scrape of hundreds of streams is megabytes of text. `/metrics` serves a render at most
`RENDER_TTL_S` old, and scrapes that arrive while one is being made wait for it instead of
making their own; the values are read on the event loop (the parts are not thread-safe), the
text is formatted on a worker thread, so probes keep answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from pipelines.detect import BatcherStats
from pipelines.frames import FrameResult, StreamState
from pipelines.graph.counters import counter_info
from pipelines.graph.stage import FrameObserver
from pipelines.tasks import TaskOwner
from realtime.bus.delivery import PublisherStats
from realtime.streams.view import PENDING, StreamView

INFERENCE_BUCKETS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
LATENCY_BUCKETS_S = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)
RATE_WINDOW_S = 10.0
SAMPLE_EVERY_S = 1.0
RENDER_TTL_S = 1.0
STATES = (PENDING, *(s.value for s in StreamState))


@dataclass(frozen=True, slots=True)
class MetricSources:
    """Where the collector reads at scrape time."""

    streams: Callable[[], Sequence[StreamView]]
    active_runs: Callable[[], int]  # stream runs alive, including those still stopping
    publisher: Callable[[], PublisherStats]
    batcher: Callable[[], BatcherStats]
    sse_viewers: Callable[[], int]
    sse_dropped: Callable[[], int]
    sse_rejected: Callable[[], int]  # viewers refused by the per-stream or total cap
    sse_open_alerts_forgotten: Callable[[], int]  # open alerts past the per-stream bound, no longer sent to joiners
    publisher_alive: Callable[[], bool]
    detector_alive: Callable[[], bool]
    detector_oldest_call_s: Callable[[], float]
    max_streams: Callable[[], int]
    streams_rejected: Callable[[], int]
    outbox_depth: Callable[[], tuple[int, int] | None]  # (events, bytes) or None without an outbox


class FrameRates:
    """Frames per second over the last RATE_WINDOW_S, per stream and stage (in / processed / dropped)."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: dict[str, deque[tuple[float, float, float, float]]] = {}

    def sample(self, views: Iterable[StreamView], now: float) -> None:
        seen = set()
        for view in views:
            c = view.counters
            ring = self._samples.setdefault(view.stream_id, deque())
            frames_in, processed = c.get("frames_in", 0), c.get("frames_processed", 0)
            if ring and (frames_in < ring[-1][1] or processed < ring[-1][2]):
                ring.clear()  # a new run started its counters over
            ring.append((now, frames_in, processed, c.get("frames_dropped", 0)))
            while len(ring) > 2 and now - ring[0][0] > self.window_s:
                ring.popleft()
            seen.add(view.stream_id)
        for stream_id in [s for s in self._samples if s not in seen]:
            del self._samples[stream_id]

    def rates(self, stream_id: str) -> tuple[float, float, float]:
        ring = self._samples.get(stream_id)
        if not ring or len(ring) < 2:
            return (0.0, 0.0, 0.0)
        (t0, in0, proc0, drop0), (t1, in1, proc1, drop1) = ring[0], ring[-1]
        span = t1 - t0
        if span <= 0:
            return (0.0, 0.0, 0.0)
        return ((in1 - in0) / span, (proc1 - proc0) / span, (drop1 - drop0) / span)


class ServiceMetrics:
    def __init__(self, sources: MetricSources) -> None:
        self.sources = sources
        self.registry = CollectorRegistry(auto_describe=False)
        self.rates = FrameRates()
        self.inference = Histogram(
            "vidsentry_inference_seconds",
            "Model call time of each processed frame (its batch's call, pre/post-processing included)",
            ["stream"],
            buckets=INFERENCE_BUCKETS_S,
            registry=self.registry,
        )
        self.latency = Histogram(
            "vidsentry_capture_to_publish_seconds",
            "From a frame reaching the service to its detections event being published",
            ["stream"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_ServiceCollector(sources, self.rates))
        self.registry.register(_RuntimeCollector())
        ProcessCollector(registry=self.registry)
        self.renders = 0  # exposition texts made (for tests: concurrent scrapes share one)
        self._rendered: tuple[float, bytes] | None = None  # (monotonic time, text)
        self._rendering: asyncio.Task[bytes] | None = None
        self._tasks = TaskOwner("metrics")  # the render concurrent scrapes share

    def frame_observer(self, stream_id: str) -> FrameObserver:
        inference = self.inference.labels(stream_id)
        latency = self.latency.labels(stream_id)

        def observe(result: FrameResult, latency_ms: float) -> None:
            if not result.predicted:  # no model call: nothing to time
                inference.observe(result.inference_ms / 1000)
            latency.observe(latency_ms / 1000)

        return observe

    def forget(self, stream_id: str) -> None:
        """Drop a deleted stream's histogram series."""
        for histogram in (self.inference, self.latency):
            with contextlib.suppress(KeyError):  # it never processed a frame
                histogram.remove(stream_id)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def render_shared(self) -> bytes:
        """The text for one scrape: a render at most RENDER_TTL_S old, or the one being made."""
        cached = self._rendered
        if cached is not None and time.monotonic() - cached[0] < RENDER_TTL_S:
            return cached[1]
        if self._rendering is None:
            self._rendering = self._tasks.spawn(self._render_off_loop(), "metrics-render", awaited=True)
            self._rendering.add_done_callback(self._render_done)
        # Shielded: a scraper that hangs up must not cancel the render the others wait for.
        return await asyncio.shield(self._rendering)

    async def _render_off_loop(self) -> bytes:
        frozen = CollectorRegistry(auto_describe=False)
        frozen.register(_Collected(list(self.registry.collect())))
        body = await asyncio.to_thread(generate_latest, frozen)
        self.renders += 1
        self._rendered = (time.monotonic(), body)
        return body

    async def aclose(self) -> None:
        """Cancel a render still running and wait for it (the service is shutting down)."""
        await self._tasks.cancel_all()

    def _render_done(self, task: asyncio.Task[bytes]) -> None:
        self._rendering = None
        if not task.cancelled():
            task.exception()  # retrieved: each waiting scrape gets it; none left must not warn

    async def sample_rates(self) -> None:
        """Feed the frame-rate window forever (cancel to stop)."""
        while True:
            self.rates.sample(self.sources.streams(), time.monotonic())
            await asyncio.sleep(SAMPLE_EVERY_S)


class _ServiceCollector(Collector):
    def __init__(self, sources: MetricSources, rates: FrameRates) -> None:
        self.sources = sources
        self.rates = rates

    def collect(self) -> Iterable[Metric]:
        yield from self._streams()
        yield from self._events()
        yield from self._detector()
        yield from self._viewers()

    def _streams(self) -> Iterable[Metric]:
        views = self.sources.streams()
        fps = GaugeMetricFamily(
            "vidsentry_stream_fps", f"Frames per second over the last {RATE_WINDOW_S:g} s", labels=["stream", "stage"]
        )
        state = GaugeMetricFamily(
            "vidsentry_stream_state", "1 for the stream's current state", labels=["stream", "state"]
        )
        restarts = CounterMetricFamily(
            "vidsentry_stream_restarts", "Runs started after the stream ended by itself", labels=["stream"]
        )
        # Every counter of every stage, generically: the catalogue says its type, help and family.
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for view in views:
            sid = view.stream_id
            for key, value in view.counters.items():
                info = counter_info(key)
                name = f"vidsentry_stream_{info.metric or key}"
                family = families.get(name)
                if family is None:
                    labels = ["stream", info.label[0]] if info.label else ["stream"]
                    kind = CounterMetricFamily if info.kind == "counter" else GaugeMetricFamily
                    family = families[name] = kind(name, info.help, labels=labels)
                family.add_metric([sid, info.label[1]] if info.label else [sid], value)
            for stage, rate in zip(("in", "processed", "dropped"), self.rates.rates(sid), strict=True):
                fps.add_metric([sid, stage], rate)
            for name in STATES:
                state.add_metric([sid, name], 1.0 if view.state == name else 0.0)
            restarts.add_metric([sid], view.restarts)
        streams = GaugeMetricFamily("vidsentry_streams", "Desired streams", value=len(views))
        runs = GaugeMetricFamily(
            "vidsentry_stream_runs_active",
            "Stream runs alive, including runs still stopping",
            value=self.sources.active_runs(),
        )
        limit = GaugeMetricFamily("vidsentry_streams_limit", "http.max_streams", value=self.sources.max_streams())
        rejected = CounterMetricFamily(
            "vidsentry_streams_rejected", "Streams refused by http.max_streams", value=self.sources.streams_rejected()
        )
        yield from (streams, runs, limit, rejected, *families.values(), fps, state, restarts)

    def _events(self) -> Iterable[Metric]:
        stats = self.sources.publisher()
        kinds = sorted(stats.kinds.items())
        for field, text in (
            ("published", "Events handed to the publisher"),
            ("acked", "Durable events stored by JetStream"),
            ("failed", "Events that could not be delivered"),
            ("dropped", "Live events dropped while NATS was disconnected"),
            ("retries", "Durable publish retries"),
            ("duplicates", "Durable publishes JetStream already had (deduplicated by Nats-Msg-Id)"),
            ("spooled", "Durable events queued in the disk outbox instead of sent directly"),
            ("replayed", "Durable events acked after waiting in the disk outbox"),
            ("dropped_overflow", "Durable events dropped because the disk outbox was full"),
        ):
            family = CounterMetricFamily(f"vidsentry_events_{field}", text, labels=["kind"])
            for kind, counts in kinds:
                family.add_metric([kind], getattr(counts, field))
            yield family
        connected = GaugeMetricFamily(
            "vidsentry_nats_connected", "1 while connected to NATS", value=1.0 if stats.connected else 0.0
        )
        pending = GaugeMetricFamily(
            "vidsentry_nats_pending_acks", "Durable events waiting for their JetStream ack", value=stats.pending_acks
        )
        backlog = GaugeMetricFamily(
            "vidsentry_nats_retry_backlog", "Durable events waiting for a retry", value=stats.retry_backlog
        )
        reconnects = CounterMetricFamily("vidsentry_nats_reconnects", "Reconnects to NATS", value=stats.reconnects)
        stream_ready = GaugeMetricFamily(
            "vidsentry_nats_stream_ready",
            "1 while the VIDSENTRY JetStream stream is known to take durable events",
            value=1.0 if stats.stream_ready else 0.0,
        )
        stream_checks = CounterMetricFamily(
            "vidsentry_nats_stream_checks",
            "Checks of the VIDSENTRY stream after a (re)connect or a durable publish without an ack",
            value=stats.stream_checks,
        )
        silence_pings = CounterMetricFamily(
            "vidsentry_nats_silence_pings",
            "PINGs sent because durable events waited a second with no JetStream ack arriving",
            value=stats.silence_pings,
        )
        recreations = CounterMetricFamily(
            "vidsentry_nats_stream_recreations",
            "Times the VIDSENTRY stream was found missing (deleted, broker lost its store) and created again",
            value=stats.stream_recreations,
        )
        alive = GaugeMetricFamily(
            "vidsentry_publisher_alive",
            "1 while the publisher's background tasks run",
            value=float(self.sources.publisher_alive()),
        )
        yield from (connected, pending, backlog, reconnects, stream_ready, stream_checks, silence_pings, recreations,
                    alive)
        outbox = self.sources.outbox_depth()
        if outbox is not None:
            events = GaugeMetricFamily("vidsentry_outbox_events", "Durable events spooled on disk", value=outbox[0])
            size = GaugeMetricFamily("vidsentry_outbox_bytes", "Bytes spooled on disk", value=outbox[1])
            errors = CounterMetricFamily(
                "vidsentry_outbox_disk_errors", "Outbox disk operations that failed, by kind", labels=["op"]
            )
            for op, count in sorted(stats.outbox_disk_errors.items()):
                errors.add_metric([op], count)
            yield from (events, size, errors)

    def _detector(self) -> Iterable[Metric]:
        stats = self.sources.batcher()
        calls = CounterMetricFamily("vidsentry_detector_calls", "Model calls (batches)", value=stats.calls)
        frames = CounterMetricFamily("vidsentry_detector_frames", "Frames through the model", value=stats.frames)
        failures = CounterMetricFamily("vidsentry_detector_failures", "Model calls that raised", value=stats.failures)
        busy = CounterMetricFamily("vidsentry_detector_busy_seconds", "Time the model was busy", value=stats.busy_s)
        rejected = CounterMetricFamily(
            "vidsentry_detector_rejected", "Frames refused because the batcher queue was full", value=stats.rejected
        )
        alive = GaugeMetricFamily(
            "vidsentry_detector_alive",
            "1 while the shared detector can process frames",
            value=float(self.sources.detector_alive()),
        )
        stuck = CounterMetricFamily(
            "vidsentry_detector_stuck_calls", "Model calls that ran past the stuck deadline", value=stats.stuck_calls
        )
        oldest = GaugeMetricFamily(
            "vidsentry_detector_oldest_call_seconds", "How long the longest-running model call has run (0: none)",
            value=self.sources.detector_oldest_call_s(),
        )
        yield from (calls, frames, failures, busy, rejected, alive, stuck, oldest)

    def _viewers(self) -> Iterable[Metric]:
        viewers = GaugeMetricFamily(
            "vidsentry_sse_viewers", "Open server-sent event streams", value=self.sources.sse_viewers()
        )
        dropped = CounterMetricFamily(
            "vidsentry_sse_events_dropped", "Events dropped for viewers that lagged", value=self.sources.sse_dropped()
        )
        rejected = CounterMetricFamily(
            "vidsentry_sse_viewers_rejected",
            "Event viewers refused by http.sse_max_viewers_per_stream or http.sse_max_viewers",
            value=self.sources.sse_rejected(),
        )
        forgotten = CounterMetricFamily(
            "vidsentry_sse_open_alerts_forgotten",
            "Open alerts past the per-stream bound, no longer sent to viewers who join",
            value=self.sources.sse_open_alerts_forgotten(),
        )
        yield from (viewers, dropped, rejected, forgotten)


class _Collected(Collector):
    """Metrics already read, to be formatted elsewhere."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


class _RuntimeCollector(Collector):
    """What leaks show up in first: event-loop tasks and threads (RSS and fds come from ProcessCollector)."""

    def collect(self) -> Iterable[Metric]:
        try:
            tasks = len(asyncio.all_tasks(asyncio.get_running_loop()))
        except RuntimeError:
            tasks = None  # scraped off the event loop (not the case when served over HTTP)
        if tasks is not None:
            family = GaugeMetricFamily(
                "vidsentry_asyncio_tasks", "Tasks alive on the service's event loop", value=tasks
            )
            yield family
        python = GaugeMetricFamily("vidsentry_python_threads", "Python threads alive", value=threading.active_count())
        yield python
        try:
            native = len(os.listdir("/proc/self/task"))
        except OSError:
            return  # not Linux
        family = GaugeMetricFamily(
            "vidsentry_os_threads", "Threads of this process, native ones included", value=native
        )
        yield family

