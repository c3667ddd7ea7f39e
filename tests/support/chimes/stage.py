"""Each stream's chimes: one every few frames, and the alerts of its `chime` rules."""

from __future__ import annotations

import functools

from pipelines.clock import Moment
from pipelines.event_bodies import alert_event
from pipelines.events import Event, EventSink
from pipelines.graph import StageContext
from pipelines.graph.counters import Counters
from pipelines.graph.engines import EngineKey
from pipelines.mailbox import FrameMailbox, MailboxClosed
from pipelines.rules.evaluators import STREAM_SUBJECT
from pipelines.rules.lifecycle import AlertLifecycle, AlertStart
from tests.support.chimes.body import ChimeBody
from tests.support.chimes.config import ChimesSettings
from tests.support.chimes.rule import ChimeRule

STAGE_NAME = "chimes"
CHIMES: EngineKey[ChimesSettings] = EngineKey("chimes")  # its "engine" is its settings


class ChimeStage:
    name = STAGE_NAME

    def __init__(
        self,
        stream_id: str,
        frames: FrameMailbox,
        sink: EventSink,
        settings: ChimesSettings,
        rules: tuple[ChimeRule, ...],
    ) -> None:
        self.stream_id = stream_id
        self.frames = frames
        self.sink = sink
        self.settings = settings
        self.rules = [(rule, AlertLifecycle(rule)) for rule in rules]
        self.chimes = 0
        self._seen = 0
        self._now = Moment(0.0, 0.0)

    async def run(self) -> None:
        while True:
            try:
                frame = await self.frames.get()
            except MailboxClosed:
                break
            self._seen += 1
            if self._seen % self.settings.every_frames:
                continue
            self._now = Moment(frame.t if frame.t is not None else frame.pts, frame.pts)
            body = ChimeBody(self.settings.sound, frame.seq)
            await self.sink.publish(Event(self.stream_id, frame.pts, frame.captured_at, body))
            self.chimes += 1
            for rule, lifecycle in self.rules:
                evidence = {"trigger": "chime", "sound": body.sound}
                change = lifecycle.observe(
                    self._now,
                    STREAM_SUBJECT,
                    rule.sound == body.sound,
                    hold_s=0.0,
                    describe=functools.partial(AlertStart, (), None, evidence),
                )
                if change is not None:
                    await self.sink.publish(
                        alert_event(self.stream_id, change, captured_at=frame.captured_at, snapshot=None)
                    )
        for _rule, lifecycle in self.rules:
            for change in lifecycle.finish(self._now):
                await self.sink.publish(alert_event(self.stream_id, change, captured_at=0.0, snapshot=None))

    def stop(self) -> None:
        """Nothing to do: it ends when its frames do."""

    def counters(self) -> Counters:
        return {}


def build(ctx: StageContext) -> ChimeStage | None:
    settings = ctx.engines.get(CHIMES)
    if settings is None or not ctx.spec.wants(STAGE_NAME):
        return None
    rules = tuple(rule for rule in ctx.spec.rules if isinstance(rule, ChimeRule))
    return ChimeStage(ctx.stream_id, ctx.frames(STAGE_NAME), ctx.sink, settings, rules)
