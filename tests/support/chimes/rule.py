"""The `chime` rule type: an alert while the stream's chimes are of its sound."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from pipelines.rules.specs import Rule


class ChimeRule(Rule):
    on_frames: ClassVar[bool] = False  # the chimes stage answers it
    needs: ClassVar[str] = "a chime rule needs chimes: set chimes.enabled"

    type: Literal["chime"]
    sound: str = Field(min_length=1)
