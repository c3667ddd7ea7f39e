"""One stream, run as one unit: its source and graph, built from its spec, with a summary at the end.

The graph itself (tees, stages, status relay) lives in `pipelines.graph`; the runner supplies
what only `realtime` knows: which source a spec means (a supervised camera reader, or a
browser's WebRTC session) and the shared engines and sink of the process. It never raises into its
caller: whatever goes wrong ends in `stopped` or `failed` with a reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipelines.events import EventSink
from pipelines.frame_loop import FrameLoop
from pipelines.frames import StatusChange, StreamState
from pipelines.graph import MediaSource, SharedEngines, StageFactory, StreamGraph
from pipelines.graph.counters import Counters
from pipelines.graph.stage import FrameObserver
from pipelines.stages import DEFAULT_STAGES
from realtime.errors import ServiceError
from realtime.sources.camera import CameraSource, CameraSourceSpec
from realtime.sources.supervisor import CameraSupervisor
from realtime.streams.spec import StreamSpec


class SourceUnavailable(ServiceError, ValueError):
    """This build cannot make the source the spec asks for."""


def make_source(spec: StreamSpec) -> MediaSource:
    if isinstance(spec.source, CameraSourceSpec):
        return CameraSource(spec.stream_id, spec.source)
    raise SourceUnavailable(f"stream {spec.stream_id!r}: webrtc streams are created by a browser session")


@dataclass(frozen=True, slots=True)
class StreamSummary:
    """A run's counters plus rates and latency percentiles (sorts the latency windows: not per scrape)."""

    stream_id: str
    state: str
    reason: str | None
    elapsed_s: float
    fps_processed: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    inference_p50_ms: float | None
    counters: Counters = field(default_factory=dict)

    def get(self, key: str) -> float:
        return self.counters.get(key, 0)

    def to_json(self) -> dict[str, object]:
        """Flat, as `run --json` prints it: the counters beside the rates."""
        return {
            **self.counters,
            "stream_id": self.stream_id,
            "state": self.state,
            "reason": self.reason,
            "elapsed_s": self.elapsed_s,
            "fps_processed": self.fps_processed,
            "latency_p50_ms": self.latency_p50_ms,
            "latency_p99_ms": self.latency_p99_ms,
            "inference_p50_ms": self.inference_p50_ms,
        }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return round(ordered[index], 2)


class StreamRunner:
    def __init__(
        self,
        spec: StreamSpec,
        engines: SharedEngines,
        sink: EventSink,
        *,
        on_status: Callable[[StatusChange], None] | None = None,
        on_frame: FrameObserver | None = None,
        stages: Sequence[StageFactory] = DEFAULT_STAGES,
        source: MediaSource | None = None,
    ) -> None:
        self.spec = spec
        # A browser session exists before its stream runs: the WebRTC edge hands it over.
        self.source = source if source is not None else make_source(spec)
        self.graph: StreamGraph | None = StreamGraph(
            spec.processing, self.source, stages, engines, sink, on_status=on_status, on_frame=on_frame
        )
        self._final_counters: Counters | None = None
        self._state = StreamState.CONNECTING  # these two are read once the graph is released
        self._reason: str | None = None
        self._started = time.monotonic()

    @property
    def stream_id(self) -> str:
        return self.spec.stream_id

    @property
    def state(self) -> StreamState:
        return self.graph.state if self.graph is not None else self._state

    @property
    def reason(self) -> str | None:
        return self.graph.reason if self.graph is not None else self._reason

    @reason.setter
    def reason(self, value: str | None) -> None:
        if self.graph is not None:
            self.graph.reason = value
        self._reason = value

    @property
    def frame_loop(self) -> FrameLoop | None:
        stage = self.graph.stage(FrameLoop.name) if self.graph is not None else None
        return stage if isinstance(stage, FrameLoop) else None

    @property
    def supervisor(self) -> CameraSupervisor | None:
        return self.source.supervisor if isinstance(self.source, CameraSource) else None

    def stop(self) -> None:
        if self.graph is not None:
            self.graph.stop()

    async def run(self) -> StreamState:
        assert self.graph is not None, "a released runner cannot run again"
        return await self.graph.run()

    def release(self) -> None:
        """Drop a finished run's parts now rather than at the next full GC pass.

        The source holds the graph's bound status callback, so a finished run is a reference
        cycle that keeps its last frame (a megabyte or more) alive until a generation-2
        collection, which may be dozens of runs away: RSS rose 8 % over 200 add/remove cycles.
        Counters, state and reason stay readable.
        """
        if self.graph is None:
            return
        self._final_counters = self.graph.counters()
        self._state, self._reason = self.graph.state, self.graph.reason
        self.graph = None
        if isinstance(self.source, CameraSource):
            self.source.supervisor = None

    def counters(self) -> Counters:
        if self.graph is None:
            return dict(self._final_counters or {})
        return self.graph.counters()

    def summary(self) -> StreamSummary:
        elapsed = time.monotonic() - self._started
        counters = self.counters()
        loop = self.frame_loop
        latency = list(loop.stats.latency_ms) if loop else []
        processed = counters.get("frames_processed", 0)
        return StreamSummary(
            stream_id=self.stream_id,
            state=self.state.value,
            reason=self.reason,
            elapsed_s=round(elapsed, 2),
            fps_processed=round(processed / elapsed, 2) if elapsed > 0 else 0.0,
            latency_p50_ms=percentile(latency, 50),
            latency_p99_ms=percentile(latency, 99),
            inference_p50_ms=percentile(list(loop.stats.inference_ms), 50) if loop else None,
            counters=counters,
        )
