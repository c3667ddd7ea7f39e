"""The `chimes:` section."""

from __future__ import annotations

from pydantic import Field

from pipelines.sections import Section


class ChimesSettings(Section):
    enabled: bool = True
    sound: str = "bell"  # what every chime sounds like
    every_frames: int = Field(5, ge=1, le=1000)  # a chime every this many frames
