"""The speech-recognition contract: requests, results and the recognizer protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from engines.errors import EngineUnavailable

SAMPLE_RATE = 16_000
AUTO = "auto"  # a request's language: detected, whatever language the recognizer is held to
MAX_AUDIO_S = 30.0  # Whisper's window: one request never holds more


class AsrUnavailable(EngineUnavailable, RuntimeError):
    """The ASR model or runtime cannot be used here (missing package, bad model dir, no CUDA)."""


@dataclass(frozen=True, slots=True)
class AsrWord:
    word: str  # as Whisper spells it, leading space kept (" hello")
    start: float  # seconds from the start of the request's audio
    end: float
    probability: float


@dataclass(frozen=True, slots=True)
class AsrRequest:
    audio: np.ndarray  # float32 mono 16 kHz in [-1, 1], at most 30 s
    prompt: str = ""  # committed text before this audio, to condition on (previous_text); may be ""
    # Text known to be said at the start of this audio: the decoder is made to begin with it and
    # goes on from there (the result's words include it, timed like the rest).
    prefix: str = ""
    # The decoder's beam for this request; None: the recognizer's own. Requests of one batch with
    # different beams are decoded in separate groups.
    beam_size: int | None = None
    # The language spoken; None: the recognizer's own (its setting, or detected per request); AUTO:
    # detected for this request even where the recognizer is held to a language.
    language: str | None = None
    # translate: English text of the speech (multilingual models only); the result's language is
    # still the one spoken.
    task: Literal["transcribe", "translate"] = "transcribe"


@dataclass(frozen=True, slots=True)
class AsrResult:
    words: tuple[AsrWord, ...]
    text: str  # the words joined, stripped (words aligned after the end of the audio are left out)
    no_speech_prob: float
    avg_logprob: float
    compression_ratio: float
    language: str


@dataclass(frozen=True, slots=True)
class AsrInfo:
    name: str  # e.g. "tiny.en" or the model dir name
    path: str
    device: str  # "cpu" | "cuda"
    compute_type: str
    sample_rate: int = SAMPLE_RATE


class SpeechRecognizer(Protocol):
    info: AsrInfo
    workers: int  # calls that may run at once, each on its own thread

    def transcribe_batch(self, requests: Sequence[AsrRequest]) -> list[AsrResult]:
        """Blocking; called from up to `workers` threads at once. One result per request, in order."""
        ...

    def close(self) -> None: ...
