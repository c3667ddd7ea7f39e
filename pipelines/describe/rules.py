"""The `vlm` rule type, owned by the descriptions capability: a question the describer puts to the
VLM on its own cadence, so the frame loop's rule engine leaves it alone and it names no class.
Declared in `pipelines.describe.capability` (`Capability.rules`), which puts it in the config's
rule union and checks that a VLM is there to answer it."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from pipelines.rules.specs import MAX_DURATION_S, Rule

MAX_QUESTION_CHARS = 300
VLM_RULE_NEEDS_VLM = "a vlm rule needs a VLM: set vlm.endpoints (or --vlm-url)"


class VlmRule(Rule):
    """A yes/no question put to the vision-language model every `cadence_s` seconds about the
    stream's recent frames ("is anyone lying on the ground?"); "yes" for `for_s` seconds is an
    alert. Answered by the describer (only where a VLM is configured), not the frame loop."""

    on_frames: ClassVar[bool] = False
    needs: ClassVar[str] = VLM_RULE_NEEDS_VLM

    type: Literal["vlm"]
    question: str = Field(min_length=3, max_length=MAX_QUESTION_CHARS)
    cadence_s: float = Field(5.0, ge=1.0, le=3600.0)
    for_s: float = Field(0.0, ge=0, le=MAX_DURATION_S)
    # Two answers apart is one "no" that may be a wrong answer; ride over it like detector flicker.
    clear_s: float = Field(10.0, ge=0, le=MAX_DURATION_S)

    @field_validator("question")
    @classmethod
    def _question(cls, value: str) -> str:
        value = " ".join(value.split())  # one line: it is written into the prompt as it is
        if len(value) < 3:
            raise ValueError("ask a question of at least 3 characters")
        return value
