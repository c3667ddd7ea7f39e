"""Boxes on every frame: a live stream's frames the model skips go out with the tracker's predicted
boxes, flagged as such, in frame order, and the rules run on them.

The detector is a plain object that finds one person moving right at a known speed (the frame's
media time is written into its pixels); the batcher, mailbox, tracker, rules and loop are real.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np

from engines.types import Detections, ModelInfo
from pipelines.detect import DetectionBatcher
from pipelines.events import Event, EventKind
from pipelines.frame_loop import FrameLoop
from pipelines.frames import DeferredImage, VideoFrame
from pipelines.mailbox import FrameMailbox
from pipelines.tracker import ByteTracker, TrackerConfig
from tests.pipelines.rules.script import rules
from tests.support.waiting import wait_until

SPEED = 100.0  # pixels per second: a fifth of the box's width between measurements 0.2 s apart
FPS = 50


def person_box(pts: float) -> np.ndarray:
    x = 20 + SPEED * pts
    return np.array([x, 100, x + 100, 200], np.float32)


def frame_image(pts: float) -> np.ndarray:
    image = np.zeros((8, 8, 3), np.uint8)
    image[0, 0, 0], image[0, 0, 1] = divmod(round(pts * 100), 256)  # centiseconds
    return image


class MovingPersonDetector:
    backend = "test"
    max_batch = 1
    workers = 1

    def __init__(self, model_s: float) -> None:
        self.info = ModelInfo(path="/models/moving.onnx", names={0: "Normal"}, imgsz=(8, 8))
        self.model_s = model_s

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        time.sleep(self.model_s)
        out = []
        for image in images:
            pts = (int(image[0, 0, 0]) * 256 + int(image[0, 0, 1])) / 100
            out.append(Detections(person_box(pts)[None], np.array([0.9], np.float32), np.array([0], np.int32)))
        return out


class Collect:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event) -> None:
        self.events.append(event)

    def detections(self) -> list[dict]:
        return [{**e.data, "pts": e.pts} for e in self.events if e.kind is EventKind.DETECTIONS]


async def run_live(
    seconds: float, *, model_s: float, blocking: bool = False, **loop_args: object
) -> tuple[Collect, FrameLoop, int]:
    """Frames paced like a live FPS camera into a latest-frame-wins mailbox (or, `blocking`, a
    file's mailbox, where the loop sees every frame and the model those detect_fps picks)."""
    sink = Collect()
    mailbox = FrameMailbox(blocking=blocking)  # live: never blocks the source
    count = round(seconds * FPS)
    base = time.time()

    def camera() -> None:
        for seq in range(count):
            pts = seq / FPS
            delay = base + pts - time.time()
            if delay > 0:
                time.sleep(delay)
            # The loop takes the previous frame first (bounded): a stalled event loop on a loaded
            # machine would otherwise drop frames, and which frames reach the model is the point.
            deadline = time.monotonic() + 5
            while mailbox.pending() and time.monotonic() < deadline:
                time.sleep(0.001)
            mailbox.put(VideoFrame("cam", seq, pts, base + pts, frame_image(pts)), timeout=5)
        mailbox.close()

    async with DetectionBatcher(MovingPersonDetector(model_s), in_flight=1) as batcher:
        loop = FrameLoop("cam", mailbox, batcher, sink, **loop_args)  # type: ignore[arg-type]
        feeder = threading.Thread(target=camera)
        feeder.start()
        await asyncio.wait_for(loop.run(), seconds + 30)
        feeder.join(5)
    return sink, loop, count


async def test_every_frame_gets_boxes_measured_or_predicted_in_order() -> None:
    sink, loop, count = await run_live(1.6, model_s=0.1)
    bodies = sink.detections()
    seqs = [b["frame_seq"] for b in bodies]
    assert seqs == sorted(set(seqs))  # in frame order, each frame once
    # The camera waits for the loop to take each frame, so none is lost: every frame has boxes.
    assert loop.mailbox.stats.dropped == 0 and loop.stats.frames_dropped == 0
    assert len(bodies) == count
    measured = [b for b in bodies if b["inference"] == "measured"]
    predicted = [b for b in bodies if b["inference"] == "predicted"]
    assert loop.stats.frames_processed == len(measured) >= 5
    assert loop.stats.frames_predicted == len(predicted) > 2 * len(measured)  # a 100 ms model on a 50 fps camera
    assert loop.counters()["frames_predicted"] == len(predicted)
    assert all("predicted" not in o for b in measured for o in b["objects"])
    tracked = [b for b in predicted if b["objects"]]
    assert tracked and all(o["predicted"] is True and o["track_id"] == 1 for b in tracked for o in b["objects"])
    assert all(b["batch_size"] == 0 for b in predicted)


async def test_predicted_boxes_follow_the_motion_between_measurements() -> None:
    sink, _, _ = await run_live(2.0, model_s=0.0, detect_fps=5)
    bodies = sink.detections()
    last_measured: np.ndarray | None = None
    extrapolated, held = [], []
    for body in bodies:
        if body["inference"] == "measured":
            last_measured = np.array(body["objects"][0]["box"])
            continue
        if last_measured is None or not body["objects"] or body["pts"] < 0.8:  # the filter learns speed first
            continue
        truth = person_box(body["pts"])
        extrapolated.append(abs(body["objects"][0]["box"][0] - truth[0]))
        held.append(abs(last_measured[0] - truth[0]))
    assert len(extrapolated) > 20
    # Carried forward, the box stays with the person; held still, it falls behind by up to 20 px.
    assert np.mean(extrapolated) < 0.5 * np.mean(held), (np.mean(extrapolated), np.mean(held))


async def test_rules_run_on_predicted_frames() -> None:
    # The feet (x + 50) cross x = 300 at pts 2.3; with detect_fps 4 the model sees pts 2.25 (outside)
    # and 2.5. A file's mailbox: every frame reaches the loop and detect_fps alone (on capture
    # times, not the wall clock) picks the measured ones, however slow this machine is.
    zone = {"id": "door", "type": "zone", "polygon": [[300, 0], [640, 0], [640, 480], [300, 480]],
            "events": ["enter"], "cooldown_s": 0, "settle_s": 0}  # settle_s 0: the very frame it crossed on
    sink, _, _ = await run_live(2.8, model_s=0.0, blocking=True, detect_fps=4, rules=rules(zone))
    starts = [e for e in sink.events if e.kind is EventKind.ALERTS and e.data["event"] == "start"]
    assert len(starts) == 1
    started = starts[0].data["started_pts"]
    assert 2.28 <= started < 2.5, started  # before the next measured frame: on a predicted one
    at_start = [b for b in sink.detections() if abs(b["pts"] - started) < 1e-6]
    assert at_start and at_start[0]["inference"] == "predicted"


def test_a_prediction_changes_nothing_the_next_measurement_sees() -> None:
    def detections(pts: float) -> Detections:
        return Detections(person_box(pts)[None], np.array([0.9], np.float32), np.array([0], np.int32))

    plain, asked = ByteTracker(), ByteTracker()
    assert asked.predict(0.0) == []  # nothing measured yet
    for step in range(10):
        pts = step * 0.2
        a, b = plain.update(detections(pts), pts), asked.update(detections(pts), pts)
        assert a.track_ids == b.track_ids
        assert np.allclose(plain.active_tracks[0].filter.mean, asked.active_tracks[0].filter.mean)
        ahead = asked.predict(pts + 0.1)
        if step >= 5:  # once the filter has learnt the speed
            (track, box), = ahead
            assert track.track_id == 1
            # Halfway to the next measurement, the last measured box is 10 px behind.
            assert abs(box[0] - person_box(pts + 0.1)[0]) < 4


async def test_under_a_compute_budget_the_model_gets_the_newest_frame_once_it_has_threads() -> None:
    from pipelines.compute import ComputeBudget, Grant, ModelClaim, Priority
    from pipelines.detect import DETECTOR

    stop = threading.Event()

    def recognizer() -> None:
        while not stop.is_set():
            with budget.turn("recognizer"):
                time.sleep(0.15)
            time.sleep(0.15)

    class TakenMailbox(FrameMailbox):
        """Notes the newest frame the loop has taken, to compare with the one the model gets."""

        newest_taken = -1

        def take_nowait(self) -> VideoFrame | None:
            frame = super().take_nowait()
            if frame is not None:
                self.newest_taken = frame.seq
            return frame

    class NotingBudget(ComputeBudget):
        """Notes the newest frame the loop had when the detector asked for threads and when it got them."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self.newest_at: list[tuple[int, int]] = []  # (asked, granted)

        async def acquire_async(self, name: str, *, last_served: float | None = None) -> Grant:
            asked = mailbox.newest_taken
            grant = await super().acquire_async(name, last_served=last_served)
            if name == DETECTOR:
                self.newest_at.append((asked, mailbox.newest_taken))
            return grant

    # One core, and a critical model that takes it for 150 ms every 300 ms: the detector (100 ms
    # calls) waits for its turns; the frame it then gets is the newest, not one queued 250 ms ago.
    budget = NotingBudget(1, {DETECTOR: ModelClaim(Priority.BULK), "recognizer": ModelClaim(Priority.CRITICAL)},
                           reserve_hold_s=0.0)
    sink = Collect()
    mailbox = TakenMailbox()
    base = time.time()
    converted: list[int] = []  # the frames whose picture was converted, as a decoder's would be

    def picture(seq: int, pts: float) -> DeferredImage:
        def convert() -> np.ndarray:
            converted.append(seq)
            return frame_image(pts)

        return DeferredImage(8, 8, convert)

    def camera() -> None:
        for seq in range(int(2.0 * FPS)):
            pts = seq / FPS
            time.sleep(max(0.0, base + pts - time.time()))
            mailbox.put(VideoFrame("cam", seq, pts, base + pts, picture(seq, pts)))
        mailbox.close()

    threads = [threading.Thread(target=recognizer), threading.Thread(target=camera)]
    async with DetectionBatcher(MovingPersonDetector(0.1), compute=budget) as batcher:
        loop = FrameLoop("cam", mailbox, batcher, sink)
        for thread in threads:
            thread.start()
        try:
            await asyncio.wait_for(loop.run(), 30)
        finally:
            stop.set()
            for thread in threads:
                thread.join(5)
    bodies = sink.detections()
    assert [b["frame_seq"] for b in bodies] == sorted({b["frame_seq"] for b in bodies})
    assert loop.stats.frames_processed >= 4 and loop.stats.frames_predicted > loop.stats.frames_processed
    assert budget.stats[DETECTOR].waited > 0  # it did wait for the recognizer ...
    # ... but before it chose a frame: each measured frame is the newest the loop had when the
    # threads were granted, and frames that came during a wait replaced the one it had asked with.
    measured = [b["frame_seq"] for b in bodies if b["inference"] == "measured"]
    assert [granted for _, granted in budget.newest_at] == measured, (budget.newest_at, measured)
    assert any(granted > asked for asked, granted in budget.newest_at), budget.newest_at
    assert budget.threads_in_use() == 0
    # Only the frames the model measured were ever converted: predicted ones need no picture.
    assert sorted(converted) == measured and len(measured) == loop.stats.frames_processed


async def test_a_stalled_event_loop_is_not_an_outage_and_ends_no_track() -> None:
    # The camera keeps sending while the event loop is blocked for longer than lost_timeout_s (a
    # loaded machine, a slow callback). When it wakes, the idle check's timeout and the waiting frame
    # are due together: the stall must not be read as the camera going silent, which would age the
    # track by the stall, end it as lost and bring the same person back under a new id.
    sink = Collect()
    mailbox = FrameMailbox()
    stop = threading.Event()
    base = time.time()

    def camera() -> None:
        seq = 0
        while not stop.is_set():
            pts = seq / FPS
            time.sleep(max(0.0, base + pts - time.time()))
            mailbox.put(VideoFrame("cam", seq, pts, base + pts, frame_image(pts)))
            seq += 1
        mailbox.close()

    def tracks() -> list[tuple[str, int, str | None]]:  # new and end: what a lost track would change
        return [(e.data["event"], e.data["track_id"], e.data.get("reason")) for e in sink.events
                if e.kind is EventKind.TRACKS and e.data["event"] in ("new", "end")]  # fmt: skip

    async with DetectionBatcher(MovingPersonDetector(0.0), in_flight=1) as batcher:
        loop = FrameLoop("cam", mailbox, batcher, sink, tracker_config=TrackerConfig(lost_timeout_s=0.4))
        feeder = threading.Thread(target=camera)
        feeder.start()
        run = asyncio.create_task(loop.run())
        try:
            await wait_until(lambda: tracks() == [("new", 1, None)], 10, "the person's track")
            time.sleep(0.8)  # noqa: ASYNC251 -- the stall itself: the event loop blocked for twice lost_timeout_s
            handled = loop.stats.frames_processed + loop.stats.frames_predicted
            await wait_until(lambda: loop.stats.frames_processed + loop.stats.frames_predicted > handled + 10, 10,
                             "frames after the stall")  # fmt: skip
        finally:
            stop.set()
            feeder.join(5)
        await asyncio.wait_for(run, 10)
    assert tracks() == [("new", 1, None), ("end", 1, "stream_stopped")], tracks()  # one track, ended with the stream
