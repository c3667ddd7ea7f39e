"""A stage of a stream's graph, and what it is built from.

A stage takes its inputs from the graph's tees when it is built (`ctx.frames(...)`,
`ctx.audio(...)`), runs until those inputs close (the source ended or was stopped), finishes
what it holds (ends open tracks, publishes last events) and returns. `stop()` is for stages with
timers of their own; most only need their inputs to close. A stage that raises fails its stream
(and only its stream); raise `StageFailed` for a failure with a reason meant for operators.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from engines.media.remux import EncodedPacket
from pipelines.clock import StreamClock
from pipelines.events import Event, EventSink
from pipelines.frames import FrameResult
from pipelines.graph.counters import Counters
from pipelines.graph.engines import SharedEngines
from pipelines.graph.source import PacketInput
from pipelines.graph.spec import ProcessingSpec
from pipelines.graph.tee import AudioTee, FrameTee
from pipelines.mailbox import AudioBuffer, FrameMailbox
from pipelines.tasks import TaskOwner

T = TypeVar("T")

# Called after each processed frame's detections event is published, with the frame's result
# and its capture → publish latency in ms (metrics hang off this).
FrameObserver = Callable[[FrameResult, float], None]


class Stage(Protocol):
    name: str

    async def run(self) -> None: ...

    def stop(self) -> None: ...

    def counters(self) -> Counters: ...


@dataclass(eq=False)
class StageContext:
    """What a stage factory gets: the stream's settings, shared engines, the event sink and the tees."""

    spec: ProcessingSpec
    engines: SharedEngines
    sink: EventSink
    frame_tee: FrameTee
    audio_tee: AudioTee | None
    on_frame: FrameObserver | None = None
    demuxed: bool = True  # the source hands its encoded video packets to packets() (else decoded frames only)
    clock: StreamClock = field(default_factory=StreamClock)  # the stream's one timeline; its frame tee stamps it
    built: list[Stage] = field(default_factory=list, repr=False)  # the stages built so far, in order
    owners: list[TaskOwner] = field(default_factory=list, repr=False)  # handed out by tasks(), in order
    packet_inputs: list[PacketInput] = field(default_factory=list, repr=False)  # added by packets()
    _primary_taken: bool = field(default=False, repr=False)

    @property
    def stream_id(self) -> str:
        return self.spec.stream_id

    @property
    def lossless(self) -> bool:
        """The source is a file played as fast as it is processed, not in real time."""
        return self.frame_tee.lossless

    def provider(self, role: type[T]) -> T | None:
        """The first stage built before this one that plays `role` (a runtime-checkable protocol):
        a stage asks for what it needs, not for another stage by name."""
        return next((s for s in self.built if isinstance(s, role)), None)

    @property
    def audio_taken(self) -> bool:
        """A stage built before this one consumes the stream's audio."""
        return self.audio_tee is not None and bool(self.audio_tee.consumers)

    def frames(self, name: str, *, primary: bool = False) -> FrameMailbox:
        """A latest-frame mailbox of this stream's video for one consumer. At most one consumer is
        primary: with a lossless source (a file played as fast as possible) it holds the source
        back; every other consumer only ever gets the newest frame and never slows anyone."""
        if primary:
            if self._primary_taken:
                raise ValueError("a stream graph has one primary frame consumer")
            self._primary_taken = True
        return self.frame_tee.attach(name, primary=primary)

    def observe(self, observer: EventObserver) -> None:
        """Show `observer` every event this stream's stages publish (it must be quick and must not
        raise). Only where the graph gave its stages an `ObservedSink`."""
        if not isinstance(self.sink, ObservedSink):
            raise TypeError("this stage context's sink cannot be observed")
        self.sink.observers.append(observer)

    def enrich(self, enricher: EventEnricher) -> None:
        """Have `enricher` add to the bodies of this stream's events before any observer sees them
        and before they go out: it returns the event as it should be (a new one when it adds
        something; it must be quick, must not raise, and must not change the event it is given)."""
        if not isinstance(self.sink, ObservedSink):
            raise TypeError("this stage context's sink cannot be enriched")
        self.sink.enrichers.append(enricher)

    def tasks(self, name: str) -> TaskOwner:
        """The owner of one stage's tasks that live beside its loop (requests it must not wait
        for): named after the stream and stage, counted in the stream's counters, and cancelled
        by the graph when the stream ends if the stage has not done so itself."""
        owner = TaskOwner(f"{self.stream_id} {name}")
        self.owners.append(owner)
        return owner

    def packets(self, into: PacketInput) -> None:
        """Have the source put this stream's encoded video packets into `into` too (clips keep
        them, live viewers are sent them; a source that does not demux, such as a browser
        session, puts none). Each consumer's `put` runs on the reader thread and must be quick."""
        self.packet_inputs.append(into)

    @property
    def packet_input(self) -> PacketInput | None:
        """What the source puts its packets into: None without consumers."""
        if not self.packet_inputs:
            return None
        if len(self.packet_inputs) == 1:
            return self.packet_inputs[0]
        return PacketFanout(tuple(self.packet_inputs))

    def audio(self, name: str, *, max_seconds: float) -> AudioBuffer | None:
        """A bounded buffer of this stream's audio (16 kHz mono) for one consumer; None without audio."""
        return None if self.audio_tee is None else self.audio_tee.attach(name, max_seconds=max_seconds)


@dataclass(frozen=True, slots=True)
class PacketFanout:
    """Every packet to each consumer, in the order they asked."""

    consumers: tuple[PacketInput, ...]

    def put(self, t: float, packet: EncodedPacket) -> None:
        for consumer in self.consumers:
            consumer.put(t, packet)


StageFactory = Callable[[StageContext], "Stage | None"]

EventObserver = Callable[[Event], None]
EventEnricher = Callable[[Event], Event]


class ObservedSink:
    """The stream's sink as its stages see it. Every event its stages publish first passes the
    enrichers a stage registered with `StageContext.enrich`, in the order the stages were built,
    each returning the event with more in its body (segmentation adds masks to `detections`) as a
    new event, never changing the one it was given; the result is then shown, synchronously and
    before it goes out, to the observers registered with `StageContext.observe` (the describer
    reads the stream's tracks, alerts and captions so), and published."""

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink
        self.enrichers: list[EventEnricher] = []
        self.observers: list[EventObserver] = []

    async def publish(self, event: Event) -> None:
        for enrich in self.enrichers:
            event = enrich(event)
        for observe in self.observers:
            observe(event)
        await self.sink.publish(event)
