"""The audio of the utterance being captioned, with the media time of its first sample.

Chunks are kept as they came and joined only when a decode needs them (every step, not every
20 ms chunk). While nobody speaks only the last `pre_roll_s` is kept, so an utterance starts a
little before the voice detector noticed it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from pipelines.frames import AUDIO_SAMPLE_RATE


class AudioWindow:
    def __init__(self, rate: int = AUDIO_SAMPLE_RATE) -> None:
        self.rate = rate
        self.start = 0.0  # media seconds of the first sample
        self._chunks: deque[np.ndarray] = deque()
        self._samples = 0
        self._joined: np.ndarray | None = None

    @property
    def duration(self) -> float:
        return self._samples / self.rate

    @property
    def end(self) -> float:
        return self.start + self.duration

    def append(self, pts: float, samples: np.ndarray) -> None:
        if not self._samples:
            self.start = pts
        self._chunks.append(samples)
        self._samples += samples.shape[0]
        self._joined = None

    def audio(self) -> np.ndarray:
        if self._joined is None:
            self._joined = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
            self._chunks = deque([self._joined])
        return self._joined

    def trim_before(self, t: float) -> None:
        """Drop the audio before media time `t`."""
        cut = int(round((t - self.start) * self.rate))
        if cut <= 0:
            return
        audio = self.audio()
        cut = min(cut, audio.shape[0])
        rest = audio[cut:]
        self.start += cut / self.rate
        self._chunks = deque([rest]) if rest.shape[0] else deque()
        self._samples = rest.shape[0]
        self._joined = rest if rest.shape[0] else None

    def keep_last(self, seconds: float) -> None:
        if self.duration > seconds:
            self.trim_before(self.end - seconds)

    def clear(self) -> None:
        self._chunks.clear()
        self._samples = 0
        self._joined = None
