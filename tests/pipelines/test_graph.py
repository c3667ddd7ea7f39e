"""The stream graph on its own: a fake source, recording stages, no `realtime` anywhere."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engines.types import Detections, ModelInfo
from pipelines.detect import DetectionBatcher
from pipelines.events import Event, EventKind
from pipelines.frames import StatusChange, StreamState, VideoFrame
from pipelines.graph import (
    MediaSource,
    ProcessingSpec,
    SharedEngines,
    SourceOutputs,
    StageContext,
    StreamGraph,
)
from pipelines.graph.counters import Counters
from pipelines.mailbox import FrameMailbox, MailboxClosed
from pipelines.stages import DEFAULT_STAGES
from pipelines.tracker import TrackerConfig
from tests.support.sinks import ListSink
from tests.support.waiting import wait_until


class FakeSource:
    """Plays `frames` numbered frames at `fps` (0: as fast as the consumer takes them), then ends."""

    display = "fake://source"

    def __init__(self, frames: int, *, fps: float = 0.0, lossless: bool = False) -> None:
        self.frames, self.fps, self._lossless = frames, fps, lossless
        self.sent = 0
        self._stop = asyncio.Event()

    @property
    def lossless(self) -> bool:
        return self._lossless

    @property
    def demuxes(self) -> bool:
        return False

    async def run(self, outputs: SourceOutputs) -> StreamState:
        outputs.status(StatusChange("cam", StreamState.LIVE, None, time.time()))
        image = np.zeros((48, 64, 3), np.uint8)
        for seq in range(self.frames):
            if self._stop.is_set():
                break
            frame = VideoFrame("cam", seq, seq / 10, time.time(), image)
            # A lossless source waits for its primary consumer (off the loop, as reader threads do).
            if not await asyncio.to_thread(outputs.video.put, frame, 5.0):
                break
            self.sent += 1
            await asyncio.sleep(1 / self.fps if self.fps else 0)
        state = StreamState.STOPPED
        outputs.status(StatusChange("cam", state, StreamState.LIVE, time.time(), reason="end"))
        return state

    def stop(self) -> None:
        self._stop.set()

    def counters(self) -> Counters:
        return {"frames_in": self.sent}


@dataclass
class Recorder:
    """A frame stage that takes `delay_s` per frame and records the sequence numbers it saw; with a
    `gate`, it holds its first frame until the gate opens."""

    name: str
    mailbox: FrameMailbox
    delay_s: float
    gate: asyncio.Event | None = None
    seen: list[int] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            try:
                frame = await self.mailbox.get()
            except MailboxClosed:
                return
            self.seen.append(frame.seq)
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(self.delay_s)

    def stop(self) -> None:
        pass

    def counters(self) -> Counters:
        return {f"{self.name}_seen": len(self.seen), f"{self.name}_dropped": self.mailbox.stats.dropped}


def recorder(
    name: str, delay_s: float, *, primary: bool = False, gate: asyncio.Event | None = None
) -> tuple[list[Recorder], object]:
    built: list[Recorder] = []

    def build(ctx: StageContext) -> Recorder:
        stage = Recorder(name, ctx.frames(name, primary=primary), delay_s, gate)
        built.append(stage)
        return stage

    return built, build


class Boxes:
    """A batch detector: one box per frame, or a broken one that answers with the wrong count."""

    info = ModelInfo(path="/models/fake.onnx", names={0: "Normal", 1: "Fall"}, imgsz=(64, 64))
    backend = "fake"
    max_batch = 4

    def __init__(self, *, broken: bool = False) -> None:
        self.broken = broken

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        one = Detections(np.array([[4, 4, 20, 40]], np.float32), np.array([0.9], np.float32), np.array([0]))
        return [one] * (len(images) + (1 if self.broken else 0))


def spec(**overrides: object) -> ProcessingSpec:
    values: dict[str, object] = {"stream_id": "cam", "audio": False, "detect_fps": None, "tracker": TrackerConfig(),
                                 "rules": ()}  # fmt: skip
    values.update(overrides)
    return ProcessingSpec(**values)  # type: ignore[arg-type]


async def test_two_frame_consumers_each_get_the_newest_frame_and_the_slow_one_never_delays_the_other() -> None:
    # The slow consumer holds its first frame until the source has sent everything: what it then
    # gets, and what the fast one saw meanwhile, do not depend on how fast this machine runs.
    gate = asyncio.Event()
    fast, build_fast = recorder("fast", 0.0)
    slow, build_slow = recorder("slow", 0.0, gate=gate)
    source = FakeSource(60, fps=50)
    async with DetectionBatcher(Boxes()) as batcher:
        graph = StreamGraph(spec(), source, [build_fast, build_slow], SharedEngines(batcher), ListSink())
        run = asyncio.create_task(graph.run())
        try:
            await wait_until(lambda: source.sent == 60, 10, "the source to send every frame")
            (fast_stage,), (slow_stage,) = fast, slow
            # The fast one went on while the slow one held a frame: it has the last frame too.
            await wait_until(lambda: fast_stage.seen[-1:] == [59], 10, "the fast consumer to see the last frame")
            assert len(slow_stage.seen) == 1
            gate.set()
            assert await asyncio.wait_for(run, 10) is StreamState.STOPPED
        finally:
            gate.set()
            run.cancel()
    # The slow one's next frame is the newest on offer, the last; those in between were dropped.
    assert len(slow_stage.seen) == 2 and slow_stage.seen[1] == 59
    counters = graph.counters()
    assert counters["slow_dropped"] == 60 - 2
    assert fast_stage.seen == sorted(fast_stage.seen)
    assert counters["fast_seen"] == len(fast_stage.seen) and counters["frames_in"] == 60
    assert counters["fast_seen"] + counters["fast_dropped"] == 60  # every frame seen or counted


async def test_a_lossless_source_is_paced_by_its_primary_consumer_only() -> None:
    primary, build_primary = recorder("primary", 0.005, primary=True)
    other, build_other = recorder("other", 0.05)
    source = FakeSource(40, lossless=True)
    async with DetectionBatcher(Boxes()) as batcher:
        graph = StreamGraph(spec(), source, [build_primary, build_other], SharedEngines(batcher), ListSink())
        await asyncio.wait_for(graph.run(), 10)
    assert primary[0].seen == list(range(40))  # every frame, in order
    assert len(other[0].seen) < 40  # the secondary only ever got the newest


async def test_the_default_stages_detect_track_and_publish_with_one_timeline() -> None:
    sink = ListSink()
    # Lossless (as a file is): every frame reaches the model, which the counts below rely on; a live
    # source would send a frame that came while the model was busy to prediction instead.
    source = FakeSource(12, fps=30, lossless=True)
    async with DetectionBatcher(Boxes()) as batcher:
        graph = StreamGraph(spec(), source, DEFAULT_STAGES, SharedEngines(batcher), sink)
        assert await asyncio.wait_for(graph.run(), 10) is StreamState.STOPPED
    assert [s.name for s in graph.stages] == ["detect"]  # no audio stage without audio
    detections = sink.kinds(EventKind.DETECTIONS)
    assert len(detections) == 12 and all(len(e.data["objects"]) == 1 for e in detections)
    tracks = sink.kinds(EventKind.TRACKS)
    assert [e.data["event"] for e in tracks] == ["new", "end"]
    assert [e.data["state"] for e in sink.kinds(EventKind.STATUS)] == ["live", "stopped"]
    counters = graph.counters()
    assert counters["frames_processed"] == 12 and counters["tracks"] == 1 and counters["detections"] == 12
    assert counters["audio_seconds"] == 0  # every described counter is there, zero when unused


async def test_a_broken_detector_fails_the_stream_with_a_reason_and_nothing_hangs() -> None:
    sink = ListSink()
    async with DetectionBatcher(Boxes(broken=True)) as batcher:
        graphs = [
            StreamGraph(
                spec(stream_id=f"cam{i}"), FakeSource(1000, fps=30), DEFAULT_STAGES, SharedEngines(batcher), sink
            )
            for i in range(3)
        ]
        states = await asyncio.wait_for(asyncio.gather(*(g.run() for g in graphs)), 10)
        assert not batcher.alive
    assert states == [StreamState.FAILED] * 3
    for graph in graphs:
        assert graph.reason is not None and graph.reason.startswith("detector failed:"), graph.reason
    assert sum(1 for e in sink.kinds(EventKind.STATUS) if e.data["state"] == "failed") == 3


async def test_stop_before_run_ends_the_graph_at_once() -> None:
    built, build = recorder("r", 0.0)
    async with DetectionBatcher(Boxes()) as batcher:
        graph = StreamGraph(spec(), FakeSource(10_000, fps=100), [build], SharedEngines(batcher), ListSink())
        graph.stop()
        assert await asyncio.wait_for(graph.run(), 5) is StreamState.STOPPED
    assert len(built[0].seen) <= 1


async def test_tasks_a_stage_leaves_behind_are_counted_and_end_with_the_stream() -> None:
    forever = asyncio.Event()
    seen: dict[str, float] = {}
    owners = []

    async def hang() -> None:
        await forever.wait()

    async def crash() -> None:
        raise RuntimeError("a bug in one request")

    def build(ctx: StageContext) -> Recorder:
        owner = ctx.tasks("requests")
        owner.spawn(hang(), "cam-hang", critical=False)
        owner.spawn(crash(), "cam-crash", critical=False)
        owners.append(owner)
        return Recorder("r", ctx.frames("r", primary=True), 0.01)

    async with DetectionBatcher(Boxes()) as batcher:
        graph = StreamGraph(spec(), FakeSource(30, fps=50), [build], SharedEngines(batcher), ListSink())
        running = asyncio.create_task(graph.run())
        await wait_until(lambda: graph.counters()["task_crashes"] == 1, 5, "the crash to be counted")
        seen.update(graph.counters())
        assert await asyncio.wait_for(running, 5) is StreamState.STOPPED  # the hanging task did not hold it
    assert seen["tasks_running"] == 1 and owners[0].owner == "cam requests"
    assert graph.counters()["tasks_running"] == 0 and graph.counters()["task_crashes"] == 1


def test_a_graph_has_one_primary_frame_consumer() -> None:
    async def build_two() -> None:
        _, first = recorder("a", 0, primary=True)
        _, second = recorder("b", 0, primary=True)
        async with DetectionBatcher(Boxes()) as batcher:
            graph = StreamGraph(spec(), FakeSource(3), [first, second], SharedEngines(batcher), ListSink())
            assert await graph.run() is StreamState.FAILED
            assert "one primary" in (graph.reason or "")

    asyncio.run(build_two())


def test_the_fake_source_is_a_media_source() -> None:
    source: MediaSource = FakeSource(1)
    assert source.display == "fake://source"


class PausingSource(FakeSource):
    """Frames for `before` frames, then silence for `pause_s` (a camera outage), then more frames."""

    def __init__(self, before: int, pause_s: float, after: int) -> None:
        super().__init__(before + after, fps=20)
        self.before, self.pause_s = before, pause_s
        self.resumed_at: float | None = None

    async def run(self, outputs: SourceOutputs) -> StreamState:
        image = np.zeros((48, 64, 3), np.uint8)
        outputs.status(StatusChange("cam", StreamState.LIVE, None, time.time()))
        for seq in range(self.frames):
            if seq == self.before:
                await asyncio.sleep(self.pause_s)
                self.resumed_at = time.monotonic()
            outputs.video.put(VideoFrame("cam", seq, seq / 20, time.time(), image))
            await asyncio.sleep(0.05)
        outputs.status(StatusChange("cam", StreamState.STOPPED, StreamState.LIVE, time.time()))
        return StreamState.STOPPED


class TimedSink(ListSink):
    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    async def publish(self, event: Event) -> None:
        await super().publish(event)
        self.at.append(time.monotonic())


async def test_tracks_and_their_alerts_end_during_an_outage_not_after_it() -> None:
    sink = TimedSink()
    source = PausingSource(before=20, pause_s=3.0, after=5)
    present = {"id": "someone", "type": "present", "classes": ["Normal"], "for_s": 0, "clear_s": 0}
    from tests.pipelines.rules.script import rules  # the rule specs as the config would load them

    async with DetectionBatcher(Boxes()) as batcher:
        graph = StreamGraph(spec(rules=tuple(rules(present))), source, DEFAULT_STAGES, SharedEngines(batcher), sink)
        await asyncio.wait_for(graph.run(), 15)
    assert source.resumed_at is not None
    timeline = list(zip(sink.events, sink.at, strict=True))
    ends = [(e, at) for e, at in timeline if e.kind is EventKind.TRACKS and e.data["event"] == "end"]
    first_end, ended_at = ends[0]
    # Ended while the camera was silent, 1.5 s after it was last seen, with no outage in its duration.
    assert ended_at < source.resumed_at and first_end.data["reason"] == "lost"
    assert first_end.data["duration_s"] < 1.5
    alert_ends = [(e, at) for e, at in timeline if e.kind is EventKind.ALERTS and e.data["event"] == "end"]
    assert alert_ends and alert_ends[0][1] < source.resumed_at
    assert alert_ends[0][0].data["evidence"]["reason"] == "cleared"  # nobody is there once the track ended
    # After the outage the person is a new track.
    news = [e for e in sink.kinds(EventKind.TRACKS) if e.data["event"] == "new"]
    assert len(news) == 2 and news[0].data["track_id"] != news[1].data["track_id"]


async def test_one_clock_stamps_every_frame_once_so_every_consumer_reads_the_same_time_through_a_restart(
) -> None:
    from pipelines.clock import StreamClock
    from pipelines.graph import FrameTee

    clock = StreamClock()
    tee = FrameTee(clock=clock)
    first, second = tee.attach("first"), tee.attach("second")
    image = np.zeros((4, 4, 3), np.uint8)
    now = time.time()
    stamped: list[tuple[float | None, float | None]] = []
    # 2 s of frames, then the source reconnects and its pts start again near 0 (a second later).
    for seq, (pts, at) in enumerate([(10.0, now), (11.0, now + 1), (12.0, now + 2), (0.1, now + 3), (1.1, now + 4)]):
        assert tee.put(VideoFrame("cam", seq, pts, at, image))
        a, b = await first.get(), await second.get()
        stamped.append((a.t, b.t))
    assert all(a == b for a, b in stamped)  # each frame is stamped once, before any consumer sees it
    times = [a for a, _ in stamped]
    assert times[:3] == [10.0, 11.0, 12.0] and times[3] == 13.0 and times[4] == 14.0  # on, through the restart
    # A stage's moment is the stamped one; a frame that came by no tee is read from the clock then.
    stamped_frame = VideoFrame("cam", 9, 2.1, now + 5, image, t=99.0)
    assert clock.moment_of(stamped_frame.pts, stamped_frame.captured_at, stamped_frame.t) == (99.0, 2.1)
    assert clock.moment_of(2.1, now + 5, None).t == 15.0


async def test_the_stages_of_a_stream_share_its_one_clock() -> None:
    from pipelines.frame_loop import FrameLoop

    async with DetectionBatcher(Boxes()) as batcher:
        graph = StreamGraph(spec(), FakeSource(3, fps=30), DEFAULT_STAGES, SharedEngines(batcher), ListSink())
        await asyncio.wait_for(graph.run(), 10)
    (loop,) = [s for s in graph.stages if isinstance(s, FrameLoop)]
    assert loop.clock is graph.clock and loop._last_moment is not None and loop._last_moment.t == 0.2
