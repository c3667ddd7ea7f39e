"""The `clips:` config section, owned by the clips capability (off by default)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from pipelines.sections import Section


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

    @model_validator(mode="after")
    def _spans(self) -> ClipsSettings:
        if self.pre_s + self.post_s >= self.max_s:
            raise ValueError("pre_s + post_s must be shorter than max_s")
        if self.pre_s >= self.buffer_s:
            raise ValueError("buffer_s must be longer than pre_s (the buffer holds the seconds before an alert)")
        return self
