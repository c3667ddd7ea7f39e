"""What the stages of one stream need to know (the source's own settings live with the source)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipelines.frames import validate_stream_id
from pipelines.rules.specs import RuleSpec
from pipelines.tracker import TrackerConfig


@dataclass(frozen=True, slots=True)
class ProcessingSpec:
    stream_id: str
    audio: bool  # the stream's audio is decoded and handed to audio stages
    detect_fps: float | None  # cap on the detection rate; None: every frame the hardware allows
    tracker: TrackerConfig
    rules: tuple[RuleSpec, ...]
    off: frozenset[str] = frozenset()  # stages this stream turns off, by name (its stage switches)
    # A stage's own settings for this stream, by stage name (a switch's mapping: `captions: {language: es}`)
    settings: Mapping[str, Any] = field(default_factory=dict)

    def wants(self, stage: str) -> bool:
        """The stream has not turned `stage` off (whether the service can run it is the stage's
        factory's question)."""
        return stage not in self.off

    def own(self, stage: str) -> Any:
        """The stream's own settings of `stage` (its capability's model), or None: the service's."""
        return self.settings.get(stage)

    def __post_init__(self) -> None:
        validate_stream_id(self.stream_id)
