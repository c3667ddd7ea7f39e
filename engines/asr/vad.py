"""Silero VAD v6 on ONNX Runtime, streaming: one shared session, a small state per stream.

The v6 export bundled with faster-whisper takes `input` [windows, 64 + 512] (each 32 ms window
preceded by the 64 samples before it), and the LSTM state `h`, `c` [1, 1, 128]; it runs its LSTM
across the rows, so a call on n windows equals n calls on one window. A stream keeps the state, the
last 64 samples and any samples short of a full window between calls, so the probabilities do not
depend on how the audio was chunked. 16 kHz only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from engines.asr.types import AsrUnavailable

WINDOW = 512  # samples per probability at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window the model sees before each window
STATE_SHAPE = (1, 1, 128)
MAX_WINDOWS_PER_RUN = 4096  # ~131 s per ONNX call: bounds the temporary arrays for a huge input


def bundled_vad_model() -> Path:
    """faster-whisper's copy of Silero VAD v6 (no torch, no download)."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or not spec.submodule_search_locations:
        raise AsrUnavailable(
            "faster-whisper is not installed, so there is no bundled Silero VAD: pip install faster-whisper"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "assets" / "silero_vad_v6.onnx"
    if not path.is_file():
        raise AsrUnavailable(f"{path} is missing: reinstall faster-whisper (>= 1.2 bundles Silero VAD v6)")
    return path


class VadModel:
    """One ONNX Runtime session shared by every stream; `run` is thread-safe."""

    def __init__(self, session: Any, path: Path) -> None:
        self._session = session
        self.path = path

    @classmethod
    def load(cls, path: Path | None = None) -> VadModel:
        model_path = Path(path) if path is not None else bundled_vad_model()
        try:
            import onnxruntime
        except ImportError as exc:
            raise AsrUnavailable(f"onnxruntime is not importable ({exc}): pip install onnxruntime") from None
        if not model_path.is_file():
            raise AsrUnavailable(f"VAD model {model_path} does not exist (expected Silero VAD v6 ONNX)")
        options = onnxruntime.SessionOptions()
        # A few hundred kFLOP per window: one thread, no arena, and nothing taken from ASR's threads.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.enable_cpu_mem_arena = False
        options.log_severity_level = 3
        try:
            session = onnxruntime.InferenceSession(
                str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise AsrUnavailable(f"VAD model {model_path} could not be loaded: {exc}") from None
        inputs = {i.name: i.shape for i in session.get_inputs()}
        if set(inputs) != {"input", "h", "c"} or inputs["input"][-1] != CONTEXT + WINDOW:
            raise AsrUnavailable(
                f"VAD model {model_path} has inputs {inputs}; expected Silero VAD v6 as bundled with "
                f"faster-whisper: input [n, {CONTEXT + WINDOW}], h and c {list(STATE_SHAPE)}"
            )
        return cls(session, model_path)

    def run(self, rows: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """rows [n, 576] float32 -> (probabilities [n], h, c)."""
        probs, h_out, c_out = self._session.run(None, {"input": rows, "h": h, "c": c})
        return np.asarray(probs, dtype=np.float32).reshape(-1), h_out, c_out


class StreamVad:
    """One stream's VAD state. Not thread-safe: one stream is fed from one place."""

    window: int = WINDOW

    def __init__(self, model: VadModel) -> None:
        self._model = model
        self.reset()

    def reset(self) -> None:
        self._h = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)  # fewer than WINDOW samples, waiting for more

    def process(self, samples: np.ndarray) -> np.ndarray:
        """float32 16 kHz in; one speech probability per complete 512-sample window so far."""
        audio = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self._pending.size:
            audio = np.concatenate((self._pending, audio))
        count = audio.size // WINDOW
        self._pending = audio[count * WINDOW :].copy()
        if count == 0:
            return np.zeros(0, dtype=np.float32)
        out = []
        for first in range(0, count, MAX_WINDOWS_PER_RUN):
            n = min(MAX_WINDOWS_PER_RUN, count - first)
            windows = audio[first * WINDOW : (first + n) * WINDOW].reshape(n, WINDOW)
            rows = np.empty((n, CONTEXT + WINDOW), dtype=np.float32)
            rows[:, CONTEXT:] = windows
            rows[0, :CONTEXT] = self._context
            rows[1:, :CONTEXT] = windows[:-1, -CONTEXT:]
            probs, self._h, self._c = self._model.run(rows, self._h, self._c)
            self._context = windows[-1, -CONTEXT:].copy()
            out.append(probs)
        return np.concatenate(out) if len(out) > 1 else out[0]
