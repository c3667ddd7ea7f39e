"""The config's streams checked against what the service runs, as `serve` checks them before it
starts anything: here, the captions a stream chooses for itself against the open recognizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engines.asr.types import SpeechRecognizer
from engines.asr.vad import VadModel
from pipelines.captions.capability import serve_captions
from pipelines.captions.engine import CAPTIONS
from realtime.config import Config, ConfigError, load_config
from realtime.config_checks import config_own_settings_problems


def config(captions: dict[str, Any], *streams: Any) -> Config:
    return Config.model_validate({
        "captions": captions,
        "streams": [{"id": f"s{i}", "url": "rtsp://cam.example/live", "captions": c} for i, c in enumerate(streams)],
    })


async def test_config_streams_asking_what_the_recognizer_cannot_serve_are_named_with_the_reason(
    caption_models: tuple[SpeechRecognizer, VadModel],
) -> None:
    bad = config({"max_models": 1}, True, {"translate": "en"}, {"model": "base"}, {"language": "en"})
    async with serve_captions(*caption_models, bad.section("captions"), None) as engine:
        problems = config_own_settings_problems(bad, {CAPTIONS.name: engine})
        assert problems is not None
        assert "streams.1.captions: translate needs a multilingual model" in problems
        assert "streams.2.captions: captions.max_models is 1 and tiny.en is loaded; model base would be one more" \
            in problems
        assert "streams.0" not in problems and "streams.3" not in problems
    fine = config({}, {"model": "base", "language": "es", "translate": "en"}, {"model": "base"}, False)
    async with serve_captions(*caption_models, fine.section("captions"), None) as engine:
        assert config_own_settings_problems(fine, {CAPTIONS.name: engine}) is None
    assert config_own_settings_problems(bad, {}) is None  # captions off: a stream's own settings ask nothing


def test_a_config_stream_naming_a_model_by_path_or_an_unknown_language_is_refused_by_key(tmp_path: Path) -> None:
    path = tmp_path / "vidsentry.yaml"
    stream = "{id: cam, url: rtsp://cam.example/live, captions: {model: /models/x, language: q}}"
    path.write_text(f"streams:\n  - {stream}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path, environ={})
    message = str(refused.value)
    assert "streams.0.captions.model: Input should be 'tiny.en' or 'base'" in message
    assert "streams.0.captions.language: language 'q' is not one Whisper knows" in message
