"""ONNX Runtime on a CPU with calls side by side: a call alone gets every thread, overlapping
calls get narrow sessions of their own, and all of them give the same boxes."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.onnx_backend import OnnxRuntimeBackend
from engines.registry import create_detector, default_cpu_workers

PROMPT_S = 10.0


def record(session: Any, name: str, used: Counter[str], barrier: threading.Barrier | None = None) -> None:
    run = session.run

    def recorded(*args: Any, **kwargs: Any) -> Any:
        used[name] += 1
        if barrier is not None:
            barrier.wait()  # both calls inside at once
        return run(*args, **kwargs)

    session.run = recorded


@pytest.fixture(scope="module")
def tensor(nudenet_model: Path) -> np.ndarray:
    detector = create_detector(nudenet_model, "onnx-cpu", workers=1)
    image = np.random.default_rng(1).integers(0, 255, (240, 320, 3), dtype=np.uint8)
    return detector.preprocess([image]).tensor


def test_a_call_alone_uses_the_wide_session_and_overlapping_calls_narrow_ones(
    nudenet_model: Path, tensor: np.ndarray
) -> None:
    backend = OnnxRuntimeBackend(nudenet_model, threads=2, sessions=2)
    assert backend.parallel == 2
    used: Counter[str] = Counter()
    barrier = threading.Barrier(2, timeout=PROMPT_S)
    narrow = [backend._narrow.get() for _ in range(2)]
    for i, session in enumerate(narrow):
        record(session, f"narrow{i}", used, barrier)
        backend._narrow.put(session)
    record(backend._session, "wide", used)

    alone = backend.infer(tensor)
    assert used == {"wide": 1}

    outputs: list[np.ndarray] = []
    wide_inside, release = threading.Event(), threading.Event()
    wide_run = backend._session.run

    def slow_wide(*args: Any, **kwargs: Any) -> Any:
        wide_inside.set()
        release.wait(PROMPT_S)
        return wide_run(*args, **kwargs)

    backend._session.run = slow_wide
    first = threading.Thread(target=lambda: outputs.append(backend.infer(tensor)))
    first.start()
    assert wide_inside.wait(PROMPT_S)
    # While the wide session is busy, two more calls run side by side on the narrow ones.
    others = [threading.Thread(target=lambda: outputs.append(backend.infer(tensor))) for _ in range(2)]
    for thread in others:
        thread.start()
    for thread in others:
        thread.join(PROMPT_S)
    release.set()
    first.join(PROMPT_S)
    assert not barrier.broken
    assert used["narrow0"] == 1 and used["narrow1"] == 1
    assert len(outputs) == 3
    for output in outputs:
        np.testing.assert_allclose(output, alone, rtol=1e-4, atol=1e-3)


def test_one_thread_or_a_gpu_means_one_session(nudenet_model: Path) -> None:
    assert OnnxRuntimeBackend(nudenet_model, threads=1, sessions=2).parallel == 1
    assert default_cpu_workers(1) == 1 and default_cpu_workers(2) == 2
    with pytest.raises(ValueError, match="sessions"):
        OnnxRuntimeBackend(nudenet_model, sessions=0)


def test_the_detector_reports_its_workers(nudenet_model: Path) -> None:
    assert create_detector(nudenet_model, "onnx-cpu", threads=2, workers=2).workers == 2
    assert create_detector(nudenet_model, "onnx-cpu", workers=1).workers == 1
    with pytest.raises(ValueError, match="workers"):
        create_detector(nudenet_model, "onnx-cpu", workers=0)
