"""Whisper's log-mel spectrogram in numpy, for a batch of clips padded to one frame count.

Same recipe as OpenAI Whisper: 25 ms Hann window, 10 ms hop, Slaney mel filters, log10 floored at
8 below the clip's peak, scaled by (x + 4) / 4. Padding is done in samples (zeros), as Whisper does
before its STFT, so padded frames carry the clip's floor value rather than an arbitrary constant.
"""

from __future__ import annotations

from functools import cache

import numpy as np

N_FFT = 400
HOP = 160  # samples per mel frame (10 ms at 16 kHz)
FRAMES_PER_S = 100
PADDED_FRAMES = 3000  # Whisper's 30 s window


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    # Slaney scale: linear below 1 kHz, logarithmic above.
    linear = hz / (200.0 / 3)
    log = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    linear = mel * (200.0 / 3)
    log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log, linear)


@cache
def mel_filters(n_mels: int, sample_rate: int = 16_000) -> np.ndarray:
    """[n_mels, N_FFT // 2 + 1] triangular filters with Slaney area normalisation."""
    fft_hz = np.fft.rfftfreq(N_FFT, 1.0 / sample_rate)
    edges = _mel_to_hz(np.linspace(0.0, float(_hz_to_mel(np.array(sample_rate / 2.0))), n_mels + 2))
    rising = (fft_hz[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    falling = (edges[2:, None] - fft_hz[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return weights.astype(np.float32)


@cache
def _hann() -> np.ndarray:
    return np.hanning(N_FFT + 1)[:-1].astype(np.float32)  # periodic window, as torch.hann_window


def log_mel_batch(clips: list[np.ndarray], frames: int, n_mels: int = 80) -> np.ndarray:
    """[len(clips), n_mels, frames] float32; each clip zero-padded (or cut) to `frames` * HOP samples."""
    longest = min(max((len(c) for c in clips), default=0), frames * HOP)
    # Frames past the audio see only zeros, so they all take the floor value: compute the STFT only
    # where there is sound (+ the window's reach) and fill the rest. A 30 s pad then costs nothing.
    computed = min(frames, longest // HOP + N_FFT // HOP + 2)
    batch = np.zeros((len(clips), computed * HOP), dtype=np.float32)
    for row, clip in zip(batch, clips, strict=True):
        n = min(len(clip), computed * HOP)
        row[:n] = clip[:n]
    half = N_FFT // 2
    right = half if computed == frames else half + HOP  # zeros, not a reflection, past the audio
    padded = np.pad(batch, ((0, 0), (half, 0)), mode="reflect")
    padded = np.pad(padded, ((0, 0), (0, right)), mode="reflect" if computed == frames else "constant")
    # computed + 1 centered STFT columns, the last dropped as Whisper does.
    windows = np.lib.stride_tricks.sliding_window_view(padded, N_FFT, axis=1)[:, ::HOP][:, :computed]
    spectrum = np.fft.rfft(windows * _hann(), axis=-1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)  # [B, computed, bins]
    mel = power @ mel_filters(n_mels).T  # [B, computed, n_mels]
    log = np.log10(np.maximum(mel, 1e-10))
    floor = log.max(axis=(1, 2), keepdims=True) - 8.0
    out = np.empty((len(clips), frames, n_mels), dtype=np.float32)
    out[:, :computed] = np.maximum(log, floor)
    out[:, computed:] = np.maximum(-10.0, floor)  # log10 of the 1e-10 clamp, floored
    return np.ascontiguousarray(((out + 4.0) / 4.0).transpose(0, 2, 1))
