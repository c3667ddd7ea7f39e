"""Speech for caption tests: the narration's script and audio, and word error rate."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import av
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_FILE = ROOT / "samples" / "narration.txt"
_WORD = re.compile(r"[a-z0-9']+")


def words_of(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def edit_distance(ref: Sequence[str], hyp: Sequence[str]) -> int:
    """Substitutions + deletions + insertions from `ref` to `hyp` (words, or characters for CER)."""
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        current = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h))
        previous = current
    return previous[-1]


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: (substitutions + deletions + insertions) / reference words."""
    ref = words_of(reference)
    return edit_distance(ref, words_of(hypothesis)) / max(1, len(ref))


def script() -> str:
    return SCRIPT_FILE.read_text(encoding="utf-8")


def script_prefix_wer(hypothesis: str, *, start: int = 0) -> float:
    """WER against the script from word `start` on, cut where the hypothesis ends (audio that
    stops mid-sentence): the best of the cuts within a few words of the hypothesis' length."""
    reference = words_of(script())[start:]
    n = len(words_of(hypothesis))
    return min(wer(" ".join(reference[:k]), hypothesis) for k in range(max(1, n - 6), n + 7))


def load_pcm16k(path: Path, seconds: float | None = None) -> np.ndarray:
    """Mono float32 16 kHz samples of a media file's audio."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=16_000)
    parts: list[np.ndarray] = []
    with av.open(str(path)) as container:
        for frame in container.decode(audio=0):
            parts += [out.to_ndarray().reshape(-1) for out in resampler.resample(frame)]
    parts += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    samples = np.concatenate(parts).astype(np.float32)
    return samples if seconds is None else samples[: int(seconds * 16_000)]


def looped_wer(hypothesis: str, phrase: str) -> float:
    """WER against a phrase played in a loop, heard from anywhere in it: the best alignment of the
    hypothesis with a stretch of the repeated phrase of about its length."""
    said = words_of(phrase)
    heard = words_of(hypothesis)
    reference = said * (len(heard) // max(1, len(said)) + 3)
    n = len(heard)
    return min(
        wer(" ".join(reference[start : start + k]), hypothesis)
        for start in range(len(said))
        for k in range(max(1, n - 3), n + 4)
    )
