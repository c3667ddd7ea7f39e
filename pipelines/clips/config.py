"""The `clips:` config section, owned by the clips capability (off by default)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from pipelines.frames import StreamId
from pipelines.sections import Section

MAX_REDACT_CLASSES = 64


def _class_names(names: list[str]) -> list[str]:
    for name in names:
        if not name.strip():
            raise ValueError("a class name cannot be empty")
    return sorted(set(names))


class ClipStreamSettings(Section):
    """One stream's own rules for its clips (`clips.streams.<id>`); what is not set here comes from
    the section."""

    # Classes whose boxes are pixelated in this stream's clips when they leave the service (their
    # MP4 is re-encoded on first download), except the tracks its alerts are about. None: the section's.
    redact: list[str] | None = Field(None, max_length=MAX_REDACT_CLASSES)
    max_bytes: int | None = Field(None, ge=1024 * 1024, le=1 << 50)  # this stream's clips on disk: oldest go first
    max_age_s: float | None = Field(None, gt=0, le=10 * 365 * 86400.0)  # this stream's clips older are deleted

    @field_validator("redact")
    @classmethod
    def _redact(cls, names: list[str] | None) -> list[str] | None:
        return None if names is None else _class_names(names)


class ClipsSettings(Section):
    """The video around every alert, remuxed from each stream's own packets (no re-encoding)."""

    enabled: bool = False
    dir: Path = Path("clips")  # one MP4 per clip with a JSON sidecar
    pre_s: float = Field(5.0, ge=0.0, le=60.0)  # before an alert's start (from the keyframe at or before it)
    post_s: float = Field(5.0, ge=0.0, le=60.0)  # after its end
    max_s: float = Field(120.0, ge=1.0, le=3600.0)  # a clip is cut at this length even if the alert goes on
    buffer_s: float = Field(60.0, ge=1.0, le=3600.0)  # each stream's rolling buffer of packets
    buffer_max_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024, le=1 << 34)  # per stream
    max_total_bytes: int = Field(10 * 1024**3, ge=1024 * 1024, le=1 << 50)  # on disk, all clips: oldest go first
    max_age_s: float = Field(7 * 86400.0, gt=0, le=10 * 365 * 86400.0)  # older clips are deleted
    # Classes pixelated in every stream's clips on export (a stream's own `redact` replaces this).
    redact: list[str] = Field([], max_length=MAX_REDACT_CLASSES)
    streams: dict[StreamId, ClipStreamSettings] = Field({}, max_length=10_000)

    @field_validator("redact")
    @classmethod
    def _redact(cls, names: list[str]) -> list[str]:
        return _class_names(names)

    @model_validator(mode="after")
    def _spans(self) -> ClipsSettings:
        if self.pre_s + self.post_s >= self.max_s:
            raise ValueError("pre_s + post_s must be shorter than max_s")
        if self.pre_s >= self.buffer_s:
            raise ValueError("buffer_s must be longer than pre_s (the buffer holds the seconds before an alert)")
        return self

    def redact_for(self, stream_id: str) -> tuple[str, ...]:
        """The classes to pixelate in `stream_id`'s clips on export (empty: none)."""
        own = self.streams.get(stream_id)
        return tuple(own.redact if own is not None and own.redact is not None else self.redact)
