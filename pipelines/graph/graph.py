"""StreamGraph: one stream's source, tees, stages and status relay, owned as one unit.

A graph never raises into its caller: whatever goes wrong with its source or a stage ends in a
final state (`stopped` or `failed`) with a reason, so one bad stream can never take down the
others running beside it. When the source ends (its end of file, a permanent error, `stop()`),
the tees close; each stage then finishes what it holds and returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from pipelines.clock import StreamClock
from pipelines.errors import PipelineError
from pipelines.events import EventSink
from pipelines.frames import StatusChange, StreamState
from pipelines.graph.counters import Counters, merge_counters, zero_counters
from pipelines.graph.engines import SharedEngines
from pipelines.graph.source import MediaSource, SourceOutputs
from pipelines.graph.spec import ProcessingSpec
from pipelines.graph.stage import FrameObserver, ObservedSink, Stage, StageContext, StageFactory
from pipelines.graph.status import StatusRelay
from pipelines.graph.tee import AudioTee, FrameTee
from pipelines.tasks import TaskOwner

log = logging.getLogger(__name__)


class StageFailed(PipelineError, RuntimeError):
    """A stage cannot go on; `str()` is the reason shown to operators (the stream goes `failed`)."""


class StreamGraph:
    def __init__(
        self,
        spec: ProcessingSpec,
        source: MediaSource,
        stages: Sequence[StageFactory],
        engines: SharedEngines,
        sink: EventSink,
        *,
        on_status: Callable[[StatusChange], None] | None = None,
        on_frame: FrameObserver | None = None,
    ) -> None:
        self.spec = spec
        self.source = source
        self.engines = engines
        self.sink = sink
        self._factories = tuple(stages)
        self._on_status = on_status
        self._on_frame = on_frame
        self.stages: list[Stage] = []
        self.state = StreamState.CONNECTING
        self.reason: str | None = None
        self.started = time.monotonic()
        self._status = StatusRelay(spec.stream_id, sink, source=source.display)
        self._stop_requested = False
        self._owners: list[TaskOwner] = []  # the stages' task owners, once built
        self.clock: StreamClock | None = None  # the stream's timeline, made by run()

    @property
    def stream_id(self) -> str:
        return self.spec.stream_id

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def stop(self) -> None:
        self._stop_requested = True
        self.source.stop()
        for stage in self.stages:
            stage.stop()

    async def run(self) -> StreamState:
        spec = self.spec
        clock = self.clock = StreamClock()  # one timeline for every stage of this run, through reconnects
        frames = FrameTee(lossless=self.source.lossless, clock=clock)
        audio = AudioTee() if spec.audio else None
        context = StageContext(spec, self.engines, ObservedSink(self.sink), frames, audio, self._on_frame,
                               demuxed=self.source.demuxes, clock=clock)
        self._owners = context.owners
        status_task = asyncio.create_task(self._status.run(), name=f"{spec.stream_id}-status")
        try:
            # Built inside the try: a stage that cannot be built (rules that do not fit the model)
            # fails this stream with a reason, like any stage error.
            self.stages = context.built
            for factory in self._factories:
                stage = factory(context)
                if stage is not None:
                    context.built.append(stage)
            if self._stop_requested:
                self.stop()
            async with asyncio.TaskGroup() as group:
                outputs = SourceOutputs(frames, audio, self._status_changed, context.packet_input)
                group.create_task(self._run_source(outputs, frames, audio), name=f"{spec.stream_id}-source")
                for stage in self.stages:
                    group.create_task(stage.run(), name=f"{spec.stream_id}-{stage.name}")
        except* Exception as failure:  # a bug or a dead engine in a stage: fail this stream only
            self._fail(_first_cause(failure))
        finally:
            frames.close()
            if audio is not None:
                audio.close()
            for owner in context.owners:  # nothing a stage started outlives its stream
                await owner.cancel_all()
            await self._status.drain_and_stop(status_task)  # queued changes get out first
        return self.state

    async def _run_source(self, outputs: SourceOutputs, frames: FrameTee, audio: AudioTee | None) -> None:
        try:
            await self.source.run(outputs)
        finally:
            # The stages finish what is inside their inputs, then return.
            frames.close()
            if audio is not None:
                audio.close()

    def _fail(self, error: BaseException) -> None:
        reason = str(error) if isinstance(error, StageFailed) else repr(error)
        if isinstance(error, StageFailed):
            log.error("stream failed", extra={"stream_id": self.stream_id, "reason": reason})
        else:
            log.error("stream failed", extra={"stream_id": self.stream_id}, exc_info=error)
        self._status_changed(StatusChange(self.stream_id, StreamState.FAILED, self.state, time.time(), reason=reason))

    def _status_changed(self, change: StatusChange) -> None:
        self.state = change.state
        self.reason = change.reason
        log.info(
            "stream state",
            extra={"stream_id": change.stream_id, "state": change.state.value, "reason": change.reason},
        )
        if self._on_status is not None:
            self._on_status(change)
        self._status.offer(change)

    def counters(self) -> Counters:
        """Every counter of the source and the stages, plus the graph's own (cheap: for every scrape)."""
        merged = zero_counters()
        merge_counters(merged, self.source.counters())
        for stage in self.stages:
            merge_counters(merged, stage.counters())
        merged["status_events_dropped"] = self._status.dropped
        merged["status_queue_depth"] = self._status.depth
        merged["tasks_running"] = sum(len(owner) for owner in self._owners)
        merged["task_crashes"] = sum(owner.crashes for owner in self._owners)
        return merged


def _first_cause(error: BaseException) -> BaseException:
    """The first error inside nested task groups (a stage may run task groups of its own)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error
