"""One stage of a stream's graph on its own, built the way the graph builds it.

`one_stage` hands a stage factory (a capability's `build`) the context the graph would: the
spec, the shared engines, an observed list sink, and the tees stamped with the stream's clock.
The test puts frames and audio in through the tees and reads the events back; leaving the block
closes the inputs, waits for the stage to finish what it holds and cancels what it left running,
as the graph does when a stream ends. A whole stream (a source and every stage) is StreamGraph's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pipelines.clock import StreamClock
from pipelines.frames import AudioChunk, VideoFrame
from pipelines.graph import AudioTee, FrameTee, ProcessingSpec, SharedEngines, Stage, StageContext
from pipelines.graph.stage import ObservedSink
from pipelines.tracker import TrackerConfig
from tests.support.sinks import ListSink

S = TypeVar("S", bound=Stage)


def stage_spec(**overrides: Any) -> ProcessingSpec:
    """Stream `cam`'s settings: no audio, every frame, no rules, unless overridden."""
    values: dict[str, Any] = {"stream_id": "cam", "audio": False, "detect_fps": None, "tracker": TrackerConfig(),
                              "rules": ()}  # fmt: skip
    return ProcessingSpec(**{**values, **overrides})


def stage_context(
    engines: SharedEngines, spec: ProcessingSpec | None = None, *, lossless: bool = False, demuxed: bool = True
) -> StageContext:
    """What a stage factory gets from the graph, with a list sink (`context.sink.sink`) behind it."""
    spec = spec or stage_spec()
    clock = StreamClock()
    frames = FrameTee(lossless=lossless, clock=clock)
    audio = AudioTee() if spec.audio else None
    return StageContext(spec, engines, ObservedSink(ListSink()), frames, audio, demuxed=demuxed, clock=clock)


@dataclass
class OneStage(Generic[S]):
    context: StageContext
    stage: S
    events: ListSink

    def frame(self, frame: VideoFrame) -> None:
        self.context.frame_tee.put(frame)

    def audio(self, chunk: AudioChunk) -> None:
        assert self.context.audio_tee is not None, "the spec has no audio"
        self.context.audio_tee.put(chunk)


@contextlib.asynccontextmanager
async def one_stage(
    factory: Callable[[StageContext], S | None],
    engines: SharedEngines,
    spec: ProcessingSpec | None = None,
    *,
    lossless: bool = False,
    finish_within_s: float = 10.0,
) -> AsyncIterator[OneStage[S]]:
    """The stage `factory` builds, running for the block."""
    context = stage_context(engines, spec, lossless=lossless)
    stage = factory(context)
    assert stage is not None, "the factory built no stage for this spec and these engines"
    sink = context.sink
    assert isinstance(sink, ObservedSink) and isinstance(sink.sink, ListSink)
    running = asyncio.create_task(stage.run(), name=f"{context.stream_id}-{stage.name}")
    try:
        yield OneStage(context, stage, sink.sink)
    finally:
        context.frame_tee.close()
        if context.audio_tee is not None:
            context.audio_tee.close()
        try:
            await asyncio.wait_for(running, finish_within_s)
        finally:
            for owner in context.owners:
                await owner.cancel_all()
