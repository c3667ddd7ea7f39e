"""ONNX Runtime backend: CPU everywhere, CUDA when `onnxruntime-gpu` provides the CUDA EP."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from pathlib import Path
from typing import Any, Literal

import numpy as np

from engines.cpu_grant import granted_threads
from engines.errors import EngineError, EngineUnavailable, ModelLoadError

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise EngineUnavailable(
            f"onnxruntime is not importable ({exc}): pip install onnxruntime (or onnxruntime-gpu)"
        ) from None
    return onnxruntime


def cuda_ep_available() -> tuple[bool, str]:
    """Whether this onnxruntime build offers the CUDA EP, and why not."""
    ort = import_onnxruntime()
    providers = ort.get_available_providers()
    if CUDA_EP in providers:
        return True, f"onnxruntime {ort.__version__} offers {CUDA_EP}"
    return False, (
        f"onnxruntime {ort.__version__} has no {CUDA_EP} (providers: {', '.join(providers)}): "
        "pip uninstall onnxruntime && pip install onnxruntime-gpu, on a host with an NVIDIA GPU"
    )


class OnnxRuntimeBackend:
    """One model on ONNX Runtime; `infer` is thread-safe and up to `parallel` calls run side by side.

    With `sessions` above 1 (CPU only) a call that runs alone uses a session with every thread,
    and calls that overlap each use one of `sessions` narrow sessions that split the threads: ONNX
    Runtime spreads one small model's operators over two threads poorly (320n on 2 cores: 41 fps
    with one thread, 48 with two), while two frames on one thread each run at 78 fps together.
    Every session has its own thread pool, so overlapping calls never queue inside one pool, and a
    caller that sends one frame at a time (a test, `doctor --parity`) keeps every core.
    """

    max_batch: int | None = None

    def __init__(
        self,
        model_path: str | Path,
        device: Literal["cpu", "cuda"] = "cpu",
        *,
        threads: int | None = None,
        device_id: int = 0,
        sessions: int = 1,
    ) -> None:
        ort = import_onnxruntime()
        providers = execution_providers(ort, device, device_id)
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {sessions}")

        threads = threads or os.cpu_count() or 1
        if device == "cuda" or threads < 2:
            sessions = 1  # a GPU takes one call at a time; one thread cannot be split
        self._session = new_session(ort, model_path, providers, threads)  # for a call that runs alone
        self._narrow: queue.SimpleQueue[Any] = queue.SimpleQueue()  # for calls side by side
        for _ in range(sessions if sessions > 1 else 0):
            self._narrow.put(new_session(ort, model_path, providers, max(1, threads // sessions)))
        self.parallel = sessions
        self.model_path = str(model_path)  # which file runs: the FP32 original or its INT8 copy
        self.threads = threads  # the wide session's; a narrow one has threads // sessions
        self._lock = threading.Lock()
        self._running = 0
        if device == "cuda" and self._session.get_providers()[0] != CUDA_EP:
            raise EngineUnavailable(
                f"onnx-cuda: {CUDA_EP} failed to initialise (CUDA 12 / cuDNN 9 libraries missing, or no GPU); "
                "install a matching CUDA runtime or pip install 'onnxruntime-gpu[cuda,cudnn]'"
            )
        self.name = "onnxruntime-cuda" if device == "cuda" else "onnxruntime-cpu"
        model_input = self._session.get_inputs()[0]
        self.input_name: str = model_input.name
        self._input_dtype = _DTYPES.get(model_input.type, np.float32)
        self._output_name: str = self._session.get_outputs()[0].name

    @property
    def providers(self) -> list[str]:
        return list(self._session.get_providers())

    def infer(self, batch: np.ndarray) -> np.ndarray:
        if self._session is None:
            raise EngineError("onnxruntime session is closed")
        feed = batch if batch.dtype == self._input_dtype else batch.astype(self._input_dtype)
        with self._lock:
            self._running += 1
            # Nothing else of this model runs, so the wide session is free too; under a CPU
            # scheduler (engines.cpu_grant) only when the call was granted all its threads.
            grant = granted_threads()
            wide = self._running == 1 and (grant is None or grant >= self.threads)
        try:
            if wide or self.parallel == 1:
                (raw,) = self._session.run([self._output_name], {self.input_name: feed})
            else:
                session = self._narrow.get()  # blocks only past `parallel` calls at once
                try:
                    (raw,) = session.run([self._output_name], {self.input_name: feed})
                finally:
                    self._narrow.put(session)
        finally:
            with self._lock:
                self._running -= 1
        return np.asarray(raw)

    def close(self) -> None:
        # Dropping the sessions frees their arenas; ONNX Runtime has no explicit close.
        self._session = None
        self._narrow = queue.SimpleQueue()  # a call still running puts its session back here, unused


def execution_providers(ort: Any, device: str, device_id: int = 0) -> list[Any]:
    """ONNX Runtime's providers for `device`; EngineUnavailable when CUDA cannot run here."""
    if device == "cpu":
        return [CPU_EP]
    if device != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    ok, why = cuda_ep_available()
    if not ok:
        raise EngineUnavailable(f"onnx-cuda: {why}")
    # onnxruntime-gpu >= 1.21 can load CUDA/cuDNN from the nvidia-* wheels; older builds rely on
    # the system libraries. Best effort: if it fails, session creation reports the real problem.
    if hasattr(ort, "preload_dlls"):
        with contextlib.suppress(Exception):
            ort.preload_dlls()
    return [(CUDA_EP, {"device_id": device_id}), CPU_EP]


def new_session(ort: Any, model_path: str | Path, providers: list[Any], threads: int) -> Any:
    """One InferenceSession on `threads` intra-op threads that sleep when idle; ModelLoadError
    when ONNX Runtime cannot load the file."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # One model, one operator at a time: intra-op threads do the work, inter-op would oversubscribe.
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle intra-op threads normally spin; in a pipeline that decodes, tracks and publishes
    # on the same cores the spinning steals CPU from that work. Measured on 2 cores with a
    # decoder thread beside it: 320n ran at ~62 fps without spinning vs ~48 fps with it.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only; a CUDA fallback is detected below, not logged
    try:
        return ort.InferenceSession(str(model_path), sess_options=options, providers=providers)
    except Exception as exc:  # ORT raises its own exception types per failure
        raise ModelLoadError(f"{model_path}: onnxruntime cannot load it: {exc}".splitlines()[0]) from None
