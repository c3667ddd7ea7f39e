"""The `captions:` config section, owned by the captions capability: the recognizer to load and
the caption window policy's knobs (defaults from `CaptionPolicy`, written once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipelines.captions.engine import CaptionPolicy
from pipelines.sections import Section, default_of

# The streaming decodes' beam. A beam of 3 made the finals more accurate but each decode of a long
# window slower, past the finals' latency target (docs/captions.md); the transcript has its own.
DEFAULT_BEAM_SIZE = 1


def _captions(name: str) -> Any:
    return default_of(CaptionPolicy, name)


class CaptionsSettings(Section):
    """Live captions: one faster-whisper model shared by every stream with audio."""

    enabled: bool = True
    # tiny.en (bundled, English only), base (multilingual, installed from its two parts by
    # deploy/setup.sh or at the first start), or a CTranslate2 Whisper model directory; None: tiny.en
    model: Literal["tiny.en", "base"] | Path | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    compute_type: Literal["default", "int8", "int8_float16", "int8_float32", "float16", "float32"] = "int8"
    # A language code, or auto (None alike): detected once per utterance (multilingual models only)
    language: str | None = "en"
    # en: also English text of the same speech, a `translations` event per transcript (multilingual
    # models only; a bulk decode in the compute budget, after the spoken language's)
    translate: Literal["en"] | None = None
    beam_size: int = Field(DEFAULT_BEAM_SIZE, ge=1, le=10)
    # CTranslate2 threads in all (on a CPU two calls run at once, half each); 0: the cores, at most 4
    threads: int = Field(0, ge=0, le=64)
    # speech probability above which audio counts as speech
    vad_threshold: float = Field(_captions("vad_threshold"), gt=0, lt=1)
    # The latency/accuracy knob: audio is decoded again each time this much more has arrived.
    step_s: float = Field(_captions("step_s"), ge=0.1, le=10.0)
    endpoint_s: float = Field(_captions("endpoint_s"), ge=0.1, le=10.0)  # a pause this long finalizes what was said
    # A word this far behind the newest audio is final as the newest decode says it, even while
    # decodes still disagree about it: bounds the finals' lag (0: only two agreeing decodes commit).
    overdue_s: float = Field(_captions("overdue_s"), ge=0.0, le=30.0)
    # The most audio one streaming decode hears; within it the window's bound follows the stage's
    # lag (docs/captions.md). Longer reads a little more accurately and costs more per decode.
    max_window_s: float = Field(_captions("max_window_s"), ge=3.0, le=28.0)
    # Once an utterance ends, decode it whole and publish it as a `transcript` event that replaces
    # its finals where captions are read back (captions.vtt, search, the page): one more decode
    # per utterance, read back more accurately than the finals.
    transcript: bool = _captions("transcript")
    # The transcript's beam: one decode per utterance, read back in place of the finals.
    transcript_beam_size: int = Field(_captions("transcript_beam_size"), ge=1, le=10)
    # Under the compute budget (`compute:`), the most of the recent CPU time the recognizer takes
    # first while detection waits (None: compute.captions_max_share).
    cpu_share: float | None = Field(None, gt=0.0, le=1.0)
    max_lag_s: float = Field(_captions("max_lag_s"), ge=1.0, le=120.0)  # audio waiting longer is dropped, oldest first
    max_batch: int = Field(8, ge=1, le=64)  # streams decoded in one recognizer call

    @field_validator("language")
    @classmethod
    def _language(cls, value: str | None) -> str | None:
        if value is None:
            return None
        code = value.strip().lower()
        if not code:
            raise ValueError("language must be a code (en, es, fr, ...) or auto")
        return code

    @model_validator(mode="after")
    def _multilingual(self) -> CaptionsSettings:
        english_only = self.model in (None, "tiny.en")
        if english_only and self.translate is not None:
            raise ValueError("translate needs a multilingual model (model: base); tiny.en is English only")
        if english_only and self.language not in (None, "auto", "en"):  # auto on tiny.en: English
            raise ValueError(
                f"language {self.language} needs a multilingual model (model: base); tiny.en is English only"
            )
        if self.translate is not None and not self.transcript:
            raise ValueError("translate decodes each transcript: it needs transcript: true")
        return self

    @property
    def recognizer_language(self) -> str | None:
        """The language the recognizer is held to; None: detected."""
        return None if self.language in (None, "auto") else self.language

    def to_policy(self) -> CaptionPolicy:
        return CaptionPolicy(
            step_s=self.step_s,
            endpoint_s=self.endpoint_s,
            overdue_s=self.overdue_s,
            max_window_s=self.max_window_s,
            vad_threshold=self.vad_threshold,
            max_lag_s=self.max_lag_s,
            transcript=self.transcript,
            transcript_beam_size=self.transcript_beam_size,
            translate=self.translate,
        )
