"""The describer stage against the vLLM simulator (a real HTTP server with vLLM's API and prefix
cache), fed frames straight into its mailbox on an accelerated clock: requests extend each other,
at most one description in flight, speech from captions, the server's limits respected, VLM
outage and recovery, `vlm` alerts, and a stream that ends while a request is in flight."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter

from engines.vlm.client import VlmClient, VlmSettings, create_vlm_client
from pipelines.capabilities import RuleList
from pipelines.describe.rules import VlmRule
from pipelines.describe.settings import DESCRIPTIONS, DescribeEngine, DescribeSettings
from pipelines.describe.stage import DescribeStage, build
from pipelines.detect import DetectionBatcher
from pipelines.event_bodies import caption_event
from pipelines.events import EventKind, EventSink
from pipelines.frames import VideoFrame
from pipelines.graph import SharedEngines
from pipelines.graph.stage import ObservedSink
from pipelines.mailbox import FrameMailbox
from tests.pipelines.test_graph import Boxes
from tests.support.sinks import ListSink
from tests.support.stage import OneStage, one_stage, stage_spec
from tests.support.vllm_sim import VllmSimulator
from tests.support.waiting import wait_until

FAST = DescribeSettings(min_interval_s=0.2, max_interval_s=0.4, describe_interval_s=0.4, max_frames=12)
FRAME_STEP_S = 0.1  # media time between frames
WALL_STEP_S = 0.02  # five times faster than real time


@dataclass
class Harness:
    one: OneStage[DescribeStage]
    client: VlmClient
    seq: int = 0
    shade: list[int] = field(default_factory=lambda: [0])

    @property
    def stage(self) -> DescribeStage:
        return self.one.stage

    @property
    def events(self) -> ListSink:
        return self.one.events

    @property
    def sink(self) -> EventSink:
        """The stream's sink as its stages see it: what another stage publishes, the describer observes."""
        return self.one.context.sink

    async def feed(self, count: int, *, until: Callable[[], bool] | None = None) -> None:
        for _ in range(count):
            self.one.frame(frame(self.seq))
            self.seq += 1
            await asyncio.sleep(WALL_STEP_S)
            if until is not None and until():
                return

    async def feed_until(self, condition: Callable[[], bool], within_frames: int, what: str) -> None:
        await self.feed(within_frames, until=condition)
        assert condition(), f"not within {within_frames} frames: {what}"




def frame(seq: int) -> VideoFrame:
    image = np.full((180, 320, 3), 60, np.uint8)
    x = (seq * 7) % 280
    image[40:150, x : x + 40] = (200, 180, 160)  # someone walking: every frame its own picture
    return VideoFrame("cam", seq, pts=seq * FRAME_STEP_S, captured_at=time.time(), pixels=image)


@asynccontextmanager
async def describer(
    sim: VllmSimulator,
    settings: DescribeSettings = FAST,
    rules: tuple[VlmRule, ...] = (),
    off: frozenset[str] = frozenset(),
    **client: Any,
) -> AsyncIterator[Harness]:
    """The describer as a stream's graph builds it (its rules from the stream's), over `sim`."""
    vlm = create_vlm_client(VlmSettings(endpoints=(sim.url,), model=sim.model, **client))
    try:
        async with DetectionBatcher(Boxes()) as batcher:
            engines = SharedEngines(batcher, opened={DESCRIPTIONS.name: DescribeEngine(vlm, sim.model, settings)})
            async with one_stage(build, engines, stage_spec(rules=rules, off=off)) as one:
                yield Harness(one, vlm)
    finally:
        await vlm.aclose()


def flat(body: dict[str, Any], data: dict[str, str]) -> list[str]:
    """A request body's messages as the server renders them, part by part: an image is its data,
    whether it came along or the image went by uuid alone (`data` maps the uuids seen with data)."""
    out: list[str] = []
    for message in body["messages"]:
        out.append(f"<{message['role']}>")
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for part in parts:
            if part.get("type") != "image_url":
                out.append(json.dumps(part, sort_keys=True))
                continue
            if part["image_url"] is not None and "uuid" in part:
                data[part["uuid"]] = part["image_url"]["url"]
            url = data[part["uuid"]] if part["image_url"] is None else part["image_url"]["url"]
            out.append(f"<image {hashlib.sha256(url.encode()).hexdigest()}>")
        out.append("</>")
    return out


def descriptions(events: ListSink) -> list[dict[str, Any]]:
    return [dict(e.data) for e in events.kinds(EventKind.DESCRIPTIONS)]


@pytest.mark.parametrize("images", ["uuid", "data"])
async def test_descriptions_come_from_requests_that_each_extend_the_last(images: str) -> None:
    # "data": a server that takes images only as data URLs (vLLM before 0.11, llama.cpp, Ollama, ...).
    async with VllmSimulator(latency_s=0.05, limit_images=16, images=images) as sim, describer(sim) as h:
        await h.feed_until(lambda: len(descriptions(h.events)) >= 5, 200, "five descriptions")
    bodies = [b for b in sim.requests if b["messages"][-1]["role"] == "user"]
    assert len(bodies) >= 5
    data: dict[str, str] = {}
    for before, after in zip(bodies, bodies[1:], strict=False):
        previous = flat(before, data)[:-1]  # all but the end of its last turn: its instruction stays
        assert flat(after, data)[: len(previous)] == previous
    assert sim.peak_in_flight == 1  # one description at a time
    first, *rest = descriptions(h.events)
    assert first["text"] == "A person walks across an empty parking lot."
    assert set(first["fields"]) == {"description", "people", "activity", "unusual"}
    assert first["epoch"] == 1 and first["frames"] >= 1 and first["model"] == sim.model
    assert first["window_start_pts"] == 0.0 and first["window_end_pts"] >= first["window_start_pts"]
    later = rest[-1]
    assert later["frames"] > first["frames"] and later["window_start_pts"] == 0.0
    assert later["cached_tokens"] / later["prompt_tokens"] >= 0.7  # all but the new frames and the tail
    counters = h.stage.counters()
    assert counters["descriptions"] == len(descriptions(h.events))
    assert counters["vlm_cached_tokens"] > 0 and counters["describe_frames"] >= later["frames"]
    assert counters["description_failures"] == 0
    assert h.client.stats().uuid_refusals == (images == "data")


async def test_speech_from_the_streams_captions_joins_the_window() -> None:
    async with VllmSimulator() as sim, describer(sim) as h:
        await h.feed_until(lambda: len(descriptions(h.events)) >= 1, 100, "a description")
        t = h.seq * FRAME_STEP_S
        words = [(" Watch", t, t + 0.3, 0.9), (" out!", t + 0.3, t + 0.6, 0.9)]
        await h.sink.publish(
            caption_event("cam", segment_id="s1", words=words, language="en", model="tiny.en", captured_at=time.time())
        )
        await h.feed_until(lambda: any("Watch out!" in json.dumps(b) for b in sim.requests), 100, "speech sent")
    said = [
        p
        for b in sim.requests
        for m in b["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if "speech:" in p.get("text", "")
    ]
    assert said and said[0]["text"].endswith('speech: "Watch out!"')


async def test_the_servers_image_limit_and_context_length_start_shorter_epochs() -> None:
    async with VllmSimulator(limit_images=3) as sim, describer(sim) as h:
        await h.feed_until(lambda: len(descriptions(h.events)) >= 4, 300, "descriptions past the image limit")
        assert h.client.image_limit("cam") == 3
    counted = [
        sum(
            1 for m in b["messages"] if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url"
        )
        for b in sim.requests
    ]
    refused = next(i for i, n in enumerate(counted) if n > 3)
    assert all(n <= 3 for n in counted[refused + 1 :])  # refused once, then kept to
    assert h.stage.stats.epochs >= 2 and max(d["epoch"] for d in descriptions(h.events)) >= 2

    async with VllmSimulator(max_model_len=900, limit_images=50) as sim, describer(sim) as h:
        await h.feed_until(lambda: len(descriptions(h.events)) >= 4, 300, "descriptions past the context length")
    assert h.stage.window.token_limit <= 720
    assert h.stage.stats.epochs >= 2


async def test_an_outage_pauses_descriptions_and_they_resume() -> None:
    async with VllmSimulator() as sim, describer(sim, breaker_failures=2, breaker_reset_s=0.3, max_retries=0) as h:
        await h.feed_until(lambda: len(descriptions(h.events)) >= 1, 100, "a description")
        sim.down = True
        await h.feed_until(lambda: h.stage.stats.unavailable >= 3, 200, "requests refused while down")
        during = len(descriptions(h.events))
        await h.feed(20)
        assert len(descriptions(h.events)) == during
        sim.down = False
        await h.feed_until(lambda: len(descriptions(h.events)) >= during + 2, 200, "descriptions again")
    assert h.stage.stats.description_failures >= 3


SERVERS = {  # the simulator's kinds of server: vLLM >= 0.11, then what else users point us at
    "vllm": {},
    "data-urls-only": {"images": "data"},
    "json-in-a-fence": {"answers": "fenced"},
    "json-in-prose": {"answers": "prose"},
    "prose-only": {"answers": "text"},
    "strict-fields": {"refuse_fields": ("cache_salt", "priority")},
}


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_sustained_yes_is_a_vlm_alert_with_the_models_reason(server: str) -> None:
    def answer(body: dict[str, Any]) -> str:
        last = body["messages"][-1]["content"][-1]["text"]
        if "Question:" in last:
            return json.dumps({"answer": "yes", "reason": "a man lies on the floor"})
        return json.dumps(
            {"description": "A man lies on the floor.", "people": 1, "activity": "lying", "unusual": True}
        )

    (rule,) = TypeAdapter(RuleList).validate_python(
        [
            {
                "id": "down",
                "type": "vlm",
                "question": "Is anyone lying on the floor?",
                "cadence_s": 1.0,
                "for_s": 2.0,
                "severity": "critical",
            }
        ]
    )
    assert isinstance(rule, VlmRule)
    async with VllmSimulator(answer=answer, **SERVERS[server]) as sim, describer(sim, rules=(rule,)) as h:
        await h.feed_until(lambda: bool(h.events.kinds(EventKind.ALERTS)), 200, "a vlm alert")
        await h.feed_until(lambda: bool(descriptions(h.events)), 100, "a description")
        await h.feed(10)
    checks = [b for b in sim.requests if "Question:" in b["messages"][-1]["content"][-1]["text"]]
    assert checks and all(b["max_tokens"] <= 40 and b.get("priority", 0) == 0 for b in checks)
    described = [b for b in sim.requests if b not in checks]
    if server != "strict-fields":
        assert described and all(b["priority"] == 10 for b in described)  # checks go first
    assert descriptions(h.events)[0]["text"] == "A man lies on the floor."
    counters = h.stage.counters()
    assert counters["vlm_check_failures"] == 0 and counters["vlm_checks"] >= 3, counters
    start, *others = [dict(e.data) for e in h.events.kinds(EventKind.ALERTS)]
    assert start["event"] == "start" and start["rule_type"] == "vlm" and start["severity"] == "critical"
    assert start["evidence"]["reason"] == "a man lies on the floor"
    assert start["evidence"]["question"] == "Is anyone lying on the floor?" and start["evidence"]["held_s"] >= 2.0
    assert [o["event"] for o in others] == ["end"]  # one alert while it lasted; ended with the stream
    assert others[0]["evidence"]["reason"] == "stream_stopped"


async def test_a_stream_that_ends_mid_request_cancels_it_and_leaves_nothing() -> None:
    async with VllmSimulator(latency_s=30.0) as sim:
        vlm = create_vlm_client(VlmSettings(endpoints=(sim.url,), model=sim.model))
        events = ListSink()
        mailbox = FrameMailbox(asyncio.get_running_loop())
        stage = DescribeStage("cam", mailbox, DescribeEngine(vlm, sim.model, FAST), ObservedSink(events))
        task = asyncio.create_task(stage.run())
        for seq in range(100):
            mailbox.put(frame(seq))
            await asyncio.sleep(WALL_STEP_S)
            if sim.in_flight:
                break
        assert sim.in_flight == 1
        mailbox.close()
        # A bound against a hang, not a timing claim: the abort itself is shown by sim.disconnects.
        await asyncio.wait_for(task, 5)
        await wait_until(lambda: sim.in_flight == 0, 5, "the simulator to see the request go")
        assert sim.in_flight == 0 and sim.disconnects >= 1  # the HTTP request was aborted
        assert vlm.stats().in_flight == 0
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("cam-")]
        assert not events.kinds(EventKind.DESCRIPTIONS)
        await vlm.aclose()


@pytest.mark.parametrize("describe", [False])
async def test_a_stream_with_descriptions_off_only_asks_its_questions(describe: bool) -> None:
    (rule,) = TypeAdapter(RuleList).validate_python(
        [{"id": "q", "type": "vlm", "question": "Is the door open?", "cadence_s": 1.0}]
    )
    assert isinstance(rule, VlmRule)
    off = frozenset() if describe else frozenset({"describe"})  # the stream's switch, as its settings set it
    async with VllmSimulator() as sim, describer(sim, rules=(rule,), off=off) as h:
        # Until three questions were answered (each waits for the simulator's round trip, which a
        # loaded machine slows), then a few frames more in which a description could have slipped in.
        await h.feed_until(lambda: h.stage.stats.checks >= 3, 300, "three answered questions")
        await h.feed(10)
    assert h.stage.stats.checks >= 3 and h.stage.stats.descriptions == 0
    assert all("Question:" in b["messages"][-1]["content"][-1]["text"] for b in sim.requests)


async def test_slow_answers_time_out_and_malformed_ones_are_skipped_then_descriptions_go_on() -> None:
    settings = DescribeSettings(min_interval_s=0.2, max_interval_s=0.4, describe_interval_s=0.4, timeout_s=0.3)
    async with VllmSimulator(latency_s=1.0) as sim, describer(sim, settings, max_retries=0) as h:
        await h.feed_until(lambda: h.stage.stats.unavailable >= 1, 100, "a timed-out request")
        assert not descriptions(h.events)
        sim.latency_s = 0.0
        await h.feed_until(lambda: len(descriptions(h.events)) >= 1, 200, "a description once answers are quick")
        sim.malformed_next = 2
        failures = h.stage.stats.description_failures
        await h.feed_until(lambda: h.stage.stats.description_failures >= failures + 2, 200, "malformed answers")
        count = len(descriptions(h.events))
        await h.feed_until(lambda: len(descriptions(h.events)) >= count + 2, 200, "descriptions after them")
    assert all(d["text"] for d in descriptions(h.events))


class ReconnectingCamera:
    """A camera whose pts run from 54.0 until `reconnect` is set, then start again at 0 (a
    reconnect): frames 0.1 s of media time apart, played in real time, until `stop`."""

    display = "fake://reconnecting"
    lossless = False
    demuxes = False

    def __init__(self) -> None:
        self.reconnect = asyncio.Event()
        self.reconnected = False
        self.sent = 0
        self._stop = asyncio.Event()

    async def run(self, outputs: Any) -> Any:
        from pipelines.frames import StatusChange, StreamState

        outputs.status(StatusChange("cam", StreamState.LIVE, None, time.time()))
        pts, seq = 54.0, 0
        while not self._stop.is_set() and seq < 2000:
            if self.reconnect.is_set() and not self.reconnected:
                self.reconnected, pts = True, 0.0  # pts restart near 0 after the reconnect
                await asyncio.sleep(0.3)  # the outage
            outputs.video.put(VideoFrame("cam", seq, round(pts, 3), time.time(), frame(seq).image))
            self.sent, seq, pts = self.sent + 1, seq + 1, pts + FRAME_STEP_S
            await asyncio.sleep(FRAME_STEP_S)
        outputs.status(StatusChange("cam", StreamState.STOPPED, StreamState.LIVE, time.time(), reason="end"))
        return StreamState.STOPPED

    def stop(self) -> None:
        self._stop.set()

    def counters(self) -> dict[str, float]:
        return {"frames_in": self.sent}


async def test_a_vlm_alert_across_a_reconnect_ends_after_it_started_and_the_stream_counts_it() -> None:
    # A camera reconnects while a vlm alert is open: its pts start again near 0. The alert's end
    # still comes after its start (one timeline), and the stream's `alerts` counter holds both the
    # frame loop's alert and the describer's.
    from pipelines import frame_loop
    from pipelines.describe import stage as describe_stage
    from pipelines.graph import StreamGraph

    camera = ReconnectingCamera()

    def answer(body: dict[str, Any]) -> str:
        if "Question:" in body["messages"][-1]["content"][-1]["text"]:
            yes = not camera.reconnected
            return json.dumps({"answer": "yes" if yes else "no", "reason": "a man lies on the floor"})
        description = {"description": "A man lies on the floor.", "people": 1, "activity": "lying", "unusual": True}
        return json.dumps(description)

    rules = TypeAdapter(RuleList).validate_python(
        [
            {"id": "down", "type": "vlm", "question": "Is anyone lying on the floor?", "cadence_s": 1.0,
             "clear_s": 0},
            {"id": "someone", "type": "present", "classes": ["Normal"]},
        ]
    )  # fmt: skip
    sink = ListSink()

    def vlm_alerts() -> list[dict[str, Any]]:
        return [dict(e.data) for e in sink.kinds(EventKind.ALERTS) if e.data["rule_type"] == "vlm"]

    async with VllmSimulator(answer=answer) as sim, DetectionBatcher(Boxes()) as batcher:
        vlm = create_vlm_client(VlmSettings(endpoints=(sim.url,), model=sim.model))
        engines = SharedEngines(batcher, opened={DESCRIPTIONS.name: DescribeEngine(vlm, sim.model, FAST)})
        graph = StreamGraph(
            stage_spec(rules=tuple(rules), off=frozenset({"describe"})), camera,
            [frame_loop.build, describe_stage.build], engines, sink,
        )
        running = asyncio.create_task(graph.run())
        try:
            await wait_until(lambda: len(vlm_alerts()) >= 1, 20, "the vlm alert to start")
            camera.reconnect.set()
            await wait_until(lambda: len(vlm_alerts()) >= 2, 20, "the vlm alert to end after the reconnect")
        finally:
            camera.stop()
            await asyncio.wait_for(running, 10)
            await vlm.aclose()
    start, end = vlm_alerts()
    assert start["event"] == "start" and end["event"] == "end" and end["evidence"]["reason"] == "cleared"
    assert start["started_pts"] >= 54.0 and end["started_pts"] == start["started_pts"]
    assert end["ended_pts"] >= end["started_pts"]  # not 0.x: the media pts after the reconnect
    assert end["duration_s"] >= 0.3  # the outage at least
    assert end["ended_pts"] == pytest.approx(end["started_pts"] + end["duration_s"], abs=0.002)
    frame_loop_alerts = [e for e in sink.kinds(EventKind.ALERTS) if e.data["rule_type"] == "present"]
    assert [e.data["event"] for e in frame_loop_alerts] == ["start", "end"]
    for e in frame_loop_alerts:  # the frame loop's alert spans the reconnect too
        assert e.data["ended_pts" if e.data["event"] == "end" else "started_pts"] >= 54.0
    counters = graph.counters()
    assert counters["alerts"] == 2  # the frame loop's present alert and the describer's vlm alert
    assert counters["vlm_checks"] >= 2
