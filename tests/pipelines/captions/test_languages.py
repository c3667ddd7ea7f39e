"""Captions in the language spoken, and an English track, with the real multilingual Whisper base
on synthesized Spanish: the language on every body, a translation per transcript."""

from __future__ import annotations

import numpy as np
import pytest

from engines.asr.types import SpeechRecognizer
from engines.asr.vad import VadModel
from pipelines.captions.capability import serve_captions
from pipelines.captions.config import CaptionsSettings
from pipelines.compute import ComputeBudget
from pipelines.events import EventKind
from tests.support.captions import caption
from tests.support.languages import spoken
from tests.support.speech import words_of


@pytest.fixture(scope="module")
def spanish() -> np.ndarray:
    return spoken("es", 2)


async def test_spanish_speech_is_captioned_in_spanish_with_an_english_track(
    multilingual_models: tuple[SpeechRecognizer, VadModel], spanish: np.ndarray
) -> None:
    settings = CaptionsSettings(model="base", language="auto", translate="en")
    budget = ComputeBudget(2)
    async with serve_captions(*multilingual_models, settings, budget) as engine:
        assert engine.translates
        sink = await caption(engine, spanish, speed=2.0)
    transcripts = sink.of(EventKind.TRANSCRIPT)
    translations = sink.of(EventKind("translations"))
    spoken_bodies = sink.of(EventKind.PARTIALS) + sink.of(EventKind.CAPTIONS) + transcripts
    assert spoken_bodies and all(b["language"] == "es" for b in spoken_bodies), spoken_bodies
    heard = words_of(" ".join(str(t["text"]) for t in transcripts))
    assert {"buenos", "hoy", "mañana"} & set(heard), heard
    # One English line per transcript, over the same span, published after it.
    assert [t["utterance_id"] for t in translations] == [t["utterance_id"] for t in transcripts]
    for said, english in zip(transcripts, translations, strict=True):
        assert english["language"] == "en" and english["spoken_language"] == "es"
        assert english["text"] and english["start"] >= said["start"] - 0.01 and english["end"] <= said["end"] + 0.01
    assert "morning" in words_of(str(translations[0]["text"])), translations
    # The translate decodes took the transcripts' bulk turns, never the streaming decodes' critical claim.
    models = budget.snapshot()["models"]
    assert models["speech recognizer, transcripts"]["turns"] >= 2 * len(transcripts)


def test_run_prints_the_english_line_after_its_transcript() -> None:
    from pipelines.captions.printer import SpokenLines
    from pipelines.event_bodies import transcript_event, translation_event

    words = [(" Buenos", 1.0, 1.4, 0.9), (" días.", 1.5, 1.9, 0.9)]
    lines = SpokenLines()
    said = lines.see(transcript_event("cam", utterance_id="u1", replaces=[], words=words, start=1.0, end=1.9,
                                      revised=True, changed=False, language="es", model="base", captured_at=0.0))
    english = lines.see(translation_event("cam", utterance_id="u1", text="Good morning.", start=1.0, end=1.9,
                                          spoken_language="es", model="base", captured_at=0.0))
    assert said == ["[cam     1.0s] Buenos días."]
    assert english == ["[cam     1.0s] (en) Good morning."]


def test_the_settings_refuse_another_language_or_a_translation_from_the_english_model() -> None:
    from pydantic import ValidationError

    assert CaptionsSettings(language="auto").recognizer_language is None  # tiny.en: English all the same
    assert CaptionsSettings(model="base", language=" ES ").recognizer_language == "es"
    with pytest.raises(ValidationError, match="language fr needs a multilingual model"):
        CaptionsSettings(language="fr")
    with pytest.raises(ValidationError, match="translate needs a multilingual model"):
        CaptionsSettings(model="tiny.en", translate="en")
    with pytest.raises(ValidationError, match="it needs transcript: true"):
        CaptionsSettings(model="base", translate="en", transcript=False)
