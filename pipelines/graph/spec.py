"""What the stages of one stream need to know (the source's own settings live with the source)."""

from __future__ import annotations

from dataclasses import dataclass

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
    captions: bool = True  # live captions of its audio, when the service has a speech recognizer
    describe: bool = True  # rolling scene descriptions, when the service has a VLM

    def __post_init__(self) -> None:
        validate_stream_id(self.stream_id)
