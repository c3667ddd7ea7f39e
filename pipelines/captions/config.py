"""The `captions:` config section, owned by the captions capability: the recognizer to load and
the caption window policy's knobs (defaults from `CaptionPolicy`, written once); and what one
stream may choose for itself (`streams[].captions: {model, language, translate}`), over the section."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from engines.asr.languages import check_language
from engines.asr.types import AUTO as AUTO_LANGUAGE
from pipelines.captions.engine import CaptionPolicy
from pipelines.sections import Section, default_of

# The streaming decodes' beam. A beam of 3 made the finals more accurate but each decode of a long
# window slower, past the finals' latency target (docs/captions.md); the transcript has its own.
DEFAULT_BEAM_SIZE = 1
ENGLISH_MODEL = "tiny.en"  # the bundled model, English only (the section's None)
MODEL_NAMES = ("tiny.en", "base")  # what a stream may name: the bundled models, never a directory
AUTO = AUTO_LANGUAGE  # `language: auto`: detected per utterance


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
    # Recognizers loaded at once: this section's model and those streams name for themselves. One no
    # stream uses any more is closed; a stream that would need one more is refused (each is a model
    # in memory and a claim on the cores).
    max_models: int = Field(2, ge=1, le=4)

    @field_validator("language")
    @classmethod
    def _language(cls, value: str | None) -> str | None:
        return _language_code(value)

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
    def model_name(self) -> str:
        """The model as a stream would name it (a directory: its path)."""
        return ENGLISH_MODEL if self.model is None else str(self.model)

    @property
    def english_only(self) -> bool:
        return self.model in (None, ENGLISH_MODEL)

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
            language=self.language or AUTO,
        )


def _language_code(value: str | None) -> str | None:
    if value is None:
        return None
    code = value.strip().lower()
    return AUTO if code == AUTO else check_language(code)


class CaptionsStreamSettings(Section):
    """One stream's own captions (`streams[].captions: {...}` instead of true): each key given wins
    over the `captions:` section for this stream, a key left out is the section's. Checked against
    the service's section and the models it can load (`CaptionsStreamSettings.over`, and the
    capability's stream check), where the stream is configured or added."""

    # tiny.en or base; a directory is the section's alone (an API client names no paths). A stream
    # naming tiny.en without a language of its own is captioned in English, without translation.
    model: Literal["tiny.en", "base"] | None = None
    language: str | None = None  # a code or auto (multilingual models only)
    translate: Literal["en", "off"] | None = None  # en: an English track for this stream; off: none

    @field_validator("language")
    @classmethod
    def _language(cls, value: str | None) -> str | None:
        return _language_code(value)

    def over(self, section: CaptionsSettings) -> CaptionsSettings:
        """The section as this stream has it; ValueError saying why when the two together cannot
        run (a language or translation on an English-only model)."""
        update: dict[str, Any] = {}
        if self.model is not None:
            update["model"] = self.model
            if self.model == ENGLISH_MODEL:  # English only: the section's other language is not this stream's
                update |= {"language": "en", "translate": None}
        if self.language is not None:
            update["language"] = self.language
        if self.translate is not None:
            update["translate"] = None if self.translate == "off" else self.translate
        if not update:
            return section
        try:
            return CaptionsSettings.model_validate({**section.model_dump(), **update})
        except ValidationError as exc:
            reasons = (str(e["msg"]).removeprefix("Value error, ") for e in exc.errors(include_url=False))
            raise ValueError("; ".join(reasons)) from None
