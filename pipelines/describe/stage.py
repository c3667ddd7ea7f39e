"""The describer of one stream: sampled frames → window → VLM → `descriptions` events and `vlm` alerts.

The stage is a frame consumer of its own (latest-frame mailbox: it never slows detection). It
keeps frames as the sampler says (activity-driven, between the min and max interval), encodes
each once at the fixed size off the event loop, and appends it to the window. At most one
description request is in flight per stream, and at most one alert check; the shared client
bounds what all streams send together. The stream's tracks, alerts and captions reach it
through the stream's observed sink.

When the VLM is out (every endpoint down, circuit open, retry budget spent) descriptions and
checks pause for the time the client says, counted; the stream goes on, and the window keeps
to its budgets meanwhile. A request whose prompt is too long, or has more images than the server
takes, starts a new epoch and the next request goes out shorter. When the stream ends, requests
in flight are cancelled (the client aborts their HTTP requests) and open alerts end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.vlm.errors import (
    VlmBadResponse,
    VlmContextTooLong,
    VlmError,
    VlmRequestError,
    VlmTooManyImages,
    VlmUnavailable,
)
from engines.vlm.images import encode_image
from engines.vlm.types import VlmImage, VlmRequest, VlmResponse
from pipelines.clock import Moment, StreamClock
from pipelines.compute import ComputeBudget, ModelClaim, Priority
from pipelines.describe.checks import VlmChecks, parse_verdict
from pipelines.describe.rules import VlmRule
from pipelines.describe.sampler import FrameSampler
from pipelines.describe.settings import CHECK_SCHEMA, DESCRIPTION_SCHEMA, DESCRIPTIONS, DescribeEngine
from pipelines.describe.window import DescribeWindow, WindowFrame, WindowRequest, text_tokens
from pipelines.event_bodies import AlertBody, CaptionBody, TrackBody, description_event
from pipelines.events import Event, EventSink
from pipelines.frames import VideoFrame
from pipelines.graph import StageContext, counter, register_counters
from pipelines.graph.counters import Counters, summed
from pipelines.mailbox import FrameMailbox, MailboxClosed
from pipelines.rules.publishing import AlertPublisher, AlertStats
from pipelines.rules.snapshots import SnapshotStore
from pipelines.tasks import TaskOwner

log = logging.getLogger(__name__)

STAGE_NAME = "describe"
ENCODER = "frame encoder"  # the describer's JPEG encoding, in the compute budget
TICK_S = 0.25  # without frames, due requests still go out this often (an outage, a frozen picture)

register_counters(
    {
        "describe_frames": counter("Frames the describer kept (sampled and encoded for the VLM)"),
        "describe_deferred": counter("Frames the describer passed over because the compute budget was short"),
        "descriptions": counter("Scene descriptions published"),
        "description_failures": counter("Description requests that failed (VLM out, bad answer, error)"),
        "vlm_checks": counter("VLM alert checks answered"),
        "vlm_check_failures": counter("VLM alert checks that failed"),
        "vlm_unavailable": counter("VLM requests refused because the VLM was out (descriptions paused)"),
        "vlm_epochs": counter("Description windows started (epoch rolls, the first included)"),
        "vlm_prompt_tokens": counter("Prompt tokens of this stream's VLM requests"),
        "vlm_cached_tokens": counter("Prompt tokens the VLM server found in its prefix cache"),
    },
    section="vlm",
)
# The frame loop reports these for its rules' alerts; the describer for its `vlm` rules' alerts:
# the stream's counters hold the sum (`alerts`: alerts started on this stream, whatever the rule).
summed("alerts", "alerts_suppressed", "snapshot_failures")


@dataclass(slots=True)
class DescribeStats:
    frames: int = 0
    deferred: int = 0  # not sampled: the compute budget was short (only max_interval samples then)
    descriptions: int = 0
    description_failures: int = 0
    checks: int = 0
    check_failures: int = 0
    unavailable: int = 0
    epochs: int = 1
    prompt_tokens: int = 0
    cached_tokens: int = 0
    request_bytes: int = 0  # JPEG bytes of the frames as sent, each time they are sent
    requests: int = 0


class DescribeStage:
    name = STAGE_NAME

    def __init__(
        self,
        stream_id: str,
        mailbox: FrameMailbox,
        engine: DescribeEngine,
        sink: EventSink,
        *,
        rules: tuple[VlmRule, ...] = (),
        describe: bool = True,
        snapshots: SnapshotStore | None = None,
        wall: Callable[[], float] = time.time,
        compute: ComputeBudget | None = None,
        tasks: TaskOwner | None = None,
        clock: StreamClock | None = None,
    ) -> None:
        self.stream_id = stream_id
        # Frames are encoded in the budget's background turns, and sampled less while it is short.
        self.compute = compute
        if compute is not None:
            compute.add(ENCODER, ModelClaim(Priority.BACKGROUND))
        self.mailbox = mailbox
        self.engine = engine
        self.client = engine.client
        self.settings = engine.settings
        self.sink = sink
        self.snapshots = snapshots
        self.describe = describe  # False: only the stream's vlm rules are asked
        self.wall = wall  # publish time, for description lag (a bench may run a faster clock)
        self.window = DescribeWindow(self.settings)
        self.sampler = FrameSampler(
            self.settings.min_interval_s, self.settings.max_interval_s, self.settings.motion_threshold
        )
        self.checks = VlmChecks(rules)
        self.clock = clock or StreamClock()  # the stream's (shared with the frame loop through the graph)
        self.stats = DescribeStats()
        self.alerts: AlertPublisher | None = None
        self._alert_stats = AlertStats()
        self._now: Moment | None = None  # the newest frame's moment
        self._sampled: VideoFrame | None = None  # the newest frame kept (alert snapshots show it)
        self._sampled_jpeg: bytes | None = None
        # Its requests run beside the loop: a bug in one must not end the stream, nor stop the next.
        self._requests = tasks if tasks is not None else TaskOwner(f"{stream_id} describer")
        self._describing: asyncio.Task[None] | None = None
        self._checking: asyncio.Task[None] | None = None
        self._last_described_t = float("-inf")
        self._paused_until = 0.0  # monotonic: the VLM is out until then
        self._out = False  # an outage is being reported (logged once, and once when it ends)

    # -- Stage -----------------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as background:  # alert snapshots; leaving waits for them
            if self.checks:
                self.alerts = AlertPublisher(
                    self.stream_id, self.sink, background, self.snapshots, stats=self._alert_stats
                )
            try:
                while True:
                    try:
                        async with asyncio.timeout(TICK_S):
                            frame = await self.mailbox.get()
                    except MailboxClosed:
                        break
                    except TimeoutError:
                        frame = None
                    if frame is not None:
                        await self._offer(frame)
                    self._launch()
            finally:
                await self._cancel_requests()
                await self._finish_alerts()

    def stop(self) -> None:
        """Nothing to do: the stage ends when its mailbox closes."""

    def counters(self) -> Counters:
        stats = self.stats
        return {
            "describe_frames": stats.frames,
            "describe_deferred": stats.deferred,
            "descriptions": stats.descriptions,
            "description_failures": stats.description_failures,
            "vlm_checks": stats.checks,
            "vlm_check_failures": stats.check_failures,
            "vlm_unavailable": stats.unavailable,
            "vlm_epochs": stats.epochs,
            "vlm_prompt_tokens": stats.prompt_tokens,
            "vlm_cached_tokens": stats.cached_tokens,
            # Summed with the frame loop's (see `summed` above): this stage's part of the stream's.
            "alerts": self._alert_stats.started,
            "alerts_suppressed": self.checks.suppressed,
            "snapshot_failures": self._alert_stats.snapshots_failed,
        }

    # -- what the stream does (its other stages' events) -------------------------------------------

    def observe(self, event: Event) -> None:
        if event.stream_id != self.stream_id:
            return
        body = event.body
        track_came_or_went = isinstance(body, TrackBody) and body.event in ("new", "end")
        other_alert = isinstance(body, AlertBody) and body.rule_type != "vlm"
        if track_came_or_went or other_alert:
            self.sampler.note_activity()
        elif isinstance(body, CaptionBody) and event.pts is not None:
            self.sampler.note_activity()  # someone spoke: a frame to go with it
            now = self._now
            offset = now.t - now.pts if now is not None else 0.0  # media time → stream time
            self.window.add_speech(event.pts + offset, body.text)

    # -- frames in -------------------------------------------------------------------------------------

    async def _offer(self, frame: VideoFrame) -> None:
        now = self._now = self.clock.moment_of(frame.pts, frame.captured_at, frame.t)
        if self.compute is not None and self.compute.short() and not self.sampler.overdue(now.t):
            # Models wait for the cores: a description can do with fewer frames (max_interval ones).
            self.stats.deferred += 1
            return
        if not self.sampler.offer(now.t, frame.pixels):
            return
        # Encoded once, here; every request that carries the frame sends these same bytes.
        image = await asyncio.to_thread(self._encode, frame.image)
        reserve = self.settings.max_tokens + text_tokens(self.settings.instruction)
        if self.window.full(image_limit=self.client.image_limit(self.stream_id), reserve=reserve):
            self._roll(keep_newest=False)
        self.window.add_frame(WindowFrame(now.t, frame.pts, frame.captured_at, image))
        self._sampled, self._sampled_jpeg = frame, image.jpeg
        self.stats.frames += 1

    def _encode(self, image: np.ndarray) -> VlmImage:
        turn = self.compute.turn(ENCODER) if self.compute is not None else contextlib.nullcontext()
        with turn:
            return encode_image(image, self.settings.frame_size, bgr=False)

    def _roll(self, *, keep_newest: bool) -> None:
        self.window.roll(keep_newest=keep_newest)
        self.stats.epochs += 1

    # -- requests out ----------------------------------------------------------------------------------

    def _launch(self) -> None:
        now = self._now
        if now is None or time.monotonic() < self._paused_until:
            return
        if self._checking is None and self.checks:
            rule = self.checks.due(now.t)
            if rule is not None:
                self.checks.ask(rule, now.t)
                self._checking = self._requests.spawn(self._check(rule, now), name=f"{self.stream_id}-vlm-check",
                                                      critical=False, on_done=self._check_done)
        due = now.t - self._last_described_t >= self.settings.describe_interval_s
        # A description waits for a new frame: it always shows the scene as it is now (speech
        # alone asks the sampler for the next frame allowed).
        if self.describe and self._describing is None and due and self.window.has_new_frame:
            self._last_described_t = now.t
            self._describing = self._requests.spawn(self._describe(), name=f"{self.stream_id}-describe",
                                                    critical=False, on_done=self._describe_done)

    def _describe_done(self, task: asyncio.Task[None]) -> None:
        self._describing = None

    def _check_done(self, task: asyncio.Task[None]) -> None:
        self._checking = None

    def _request(self, window: WindowRequest, *, max_tokens: int, schema: Any, priority: int) -> VlmRequest:
        settings = self.settings
        self.stats.requests += 1
        self.stats.request_bytes += sum(
            len(part.jpeg) for message in window.messages for part in message.parts if isinstance(part, VlmImage)
        )
        return VlmRequest(
            messages=window.messages,
            route_key=self.stream_id,
            max_tokens=max_tokens,
            json_schema=schema,
            priority=priority,
            cache_salt=settings.cache_salt,
            timeout_s=settings.timeout_s,
        )

    async def _describe(self) -> None:
        settings = self.settings
        window = self.window.request(settings.instruction, keep=True)
        request = self._request(
            window, max_tokens=settings.max_tokens, schema=DESCRIPTION_SCHEMA, priority=settings.describe_priority
        )
        response = await self._complete(request, epoch=window.epoch, failed="description")
        if response is None:
            self.stats.description_failures += 1
            return
        fields = response.fields
        text = fields.get("description") if fields is not None else None
        text = text if isinstance(text, str) and text.strip() else response.text.strip()
        self.window.answer(window.epoch, text)
        self.stats.descriptions += 1
        published = self.wall()
        captured_at = window.newest_captured_at if window.newest_captured_at is not None else published
        try:
            await self.sink.publish(
                description_event(
                    self.stream_id,
                    text=text,
                    fields=fields,
                    window_start_pts=window.window_start_pts,
                    window_end_pts=window.window_end_pts,
                    frames=window.frames,
                    epoch=window.epoch,
                    prompt_tokens=response.prompt_tokens,
                    cached_tokens=response.cached_tokens,
                    latency_ms=response.latency_ms,
                    model=response.model,
                    captured_at=captured_at,
                )
            )
        except Exception as exc:
            log.warning("description publish failed", extra={"stream_id": self.stream_id, "error": repr(exc)})

    async def _check(self, rule: VlmRule, now: Moment) -> None:
        settings = self.settings
        instruction = settings.check_instruction.format(question=rule.question)
        window = self.window.request(instruction)
        request = self._request(
            window, max_tokens=settings.check_max_tokens, schema=CHECK_SCHEMA, priority=settings.check_priority
        )
        response = await self._complete(request, epoch=window.epoch, failed="alert check")
        if response is None:
            self.stats.check_failures += 1
            return
        self.stats.checks += 1
        verdict = parse_verdict(response.fields, response.text)
        change = self.checks.verdict(rule, now, verdict, model=response.model)
        if change is None or self.alerts is None:
            return
        frame = self._sampled
        try:
            await self.alerts.publish(
                [change],
                captured_at=frame.captured_at if frame is not None else self.wall(),
                frame=frame,
                jpeg=self._sampled_jpeg,
            )
        except Exception as exc:
            log.warning("vlm alert publish failed", extra={"stream_id": self.stream_id, "error": repr(exc)})

    async def _complete(self, request: VlmRequest, *, epoch: int, failed: str) -> VlmResponse | None:
        """The response, or None after dealing with the failure (counted by the caller)."""
        try:
            response = await self.client.complete(request)
        except VlmUnavailable as exc:
            self.stats.unavailable += 1
            self._paused_until = time.monotonic() + max(exc.retry_after_s, 0.0)
            if not self._out:
                self._out = True
                log.warning(
                    "descriptions paused: the VLM is unavailable",
                    extra={"stream_id": self.stream_id, "retry_after_s": exc.retry_after_s, "error": str(exc)},
                )
            return None
        except (VlmContextTooLong, VlmTooManyImages) as exc:
            # The window outgrew what the server takes: the next request starts a shorter epoch,
            # and later epochs keep to the server's limits (the client learns its image limit).
            if isinstance(exc, VlmContextTooLong) and exc.max_tokens:
                self.window.fit_context(exc.max_tokens)
            log.info(
                "vlm window too large; new epoch",
                extra={"stream_id": self.stream_id, "error": type(exc).__name__},
            )
            if epoch == self.window.epoch:  # once, when a check and a description both hit it
                self._roll(keep_newest=True)
            return None
        except VlmBadResponse as exc:
            log.info(f"vlm {failed}: bad answer", extra={"stream_id": self.stream_id, "error": str(exc)})
            return None
        except VlmRequestError as exc:  # our request or the configuration is wrong: say what
            log.warning(f"vlm {failed} refused", extra={"stream_id": self.stream_id, "error": str(exc)})
            return None
        except VlmError as exc:
            log.warning(f"vlm {failed} failed", extra={"stream_id": self.stream_id, "error": repr(exc)})
            return None
        if self._out:
            self._out = False
            log.info("descriptions resumed: the VLM answers again", extra={"stream_id": self.stream_id})
        self.stats.prompt_tokens += response.prompt_tokens
        self.stats.cached_tokens += response.cached_tokens or 0
        return response

    # -- the end -----------------------------------------------------------------------------------------

    async def _cancel_requests(self) -> None:
        await self._requests.cancel_all()

    async def _finish_alerts(self) -> None:
        if self.alerts is None:
            return
        now = self._now or Moment(0.0, 0.0)
        frame = self._sampled
        changes = self.checks.finish(now)
        if changes:
            await self.alerts.publish(changes, captured_at=frame.captured_at if frame is not None else self.wall())


def build(ctx: StageContext) -> DescribeStage | None:
    engine = ctx.engines.get(DESCRIPTIONS)
    rules = tuple(rule for rule in ctx.spec.rules if isinstance(rule, VlmRule))
    if engine is None:
        if rules:
            log.warning(
                "vlm rules cannot run: no VLM is configured",
                extra={"stream_id": ctx.stream_id, "rules": [r.id for r in rules]},
            )
        return None
    if not ctx.spec.wants(STAGE_NAME) and not rules:
        return None
    stage = DescribeStage(
        ctx.stream_id,
        ctx.frames(STAGE_NAME),
        engine,
        ctx.sink,
        rules=rules,
        describe=ctx.spec.wants(STAGE_NAME),
        snapshots=ctx.engines.snapshots,
        compute=ctx.engines.detector.compute,
        tasks=ctx.tasks(STAGE_NAME),
        clock=ctx.clock,
    )
    ctx.observe(stage.observe)
    return stage
