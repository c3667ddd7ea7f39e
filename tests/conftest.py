"""Shared fixtures: sample media and bundled models (all real, built locally)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.asr.types import SpeechRecognizer
from engines.asr.vad import VadModel
from engines.asr.whisper import create_recognizer

ROOT = Path(__file__).resolve().parents[1]
SAMPLES_OUT = ROOT / ".cache" / "samples"


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    sys.path.insert(0, str(ROOT / "samples"))
    try:
        import make_sample
    finally:
        sys.path.pop(0)
    if not (SAMPLES_OUT / "vtest_speech.mp4").exists():
        make_sample.main(["--out", str(SAMPLES_OUT)])
    return SAMPLES_OUT


@pytest.fixture(scope="session")
def vtest_avi(sample_dir: Path) -> Path:
    return sample_dir / "vtest.avi"


@pytest.fixture(scope="session")
def sample_clip(sample_dir: Path) -> Path:
    """vtest.avi re-encoded as H.264 + AAC narration (mp4), 79.5 s."""
    return sample_dir / "vtest_speech.mp4"


@pytest.fixture(scope="session")
def fall_model() -> Path:
    from engines.models import fall_model_path

    return fall_model_path()


@pytest.fixture(scope="session")
def nudenet_model() -> Path:
    from engines.models import nudenet_model_path

    return nudenet_model_path()


# Real servers for any test: nats-server (fresh per test, or one per session) and the
# GStreamer RTSP server (a subprocess tests may kill, freeze and restart).
from tests.support.nats import nats_server, shared_nats_server  # noqa: E402
from tests.support.rtsp import rtsp_server  # noqa: E402
from tests.support.vtest import vtest_detections  # noqa: E402

__all__ = ["nats_server", "rtsp_server", "shared_nats_server", "vtest_detections"]


@pytest.fixture(scope="session")
def caption_models() -> Iterator[tuple[SpeechRecognizer, VadModel]]:
    """The bundled tiny.en recognizer and the Silero voice detector, loaded once per test session."""
    recognizer = create_recognizer(threads=min(4, os.cpu_count() or 1))
    yield recognizer, VadModel.load()
    recognizer.close()


@pytest.fixture(scope="session")
def multilingual_models() -> Iterator[tuple[SpeechRecognizer, VadModel]]:
    """The multilingual Whisper base, detecting the language, and Silero, loaded once per session."""
    recognizer = create_recognizer("base", language=None, threads=min(4, os.cpu_count() or 1))
    yield recognizer, VadModel.load()
    recognizer.close()
