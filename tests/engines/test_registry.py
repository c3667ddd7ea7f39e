"""Backend selection, unavailable runtimes and `doctor` on this machine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from engines.errors import EngineUnavailable
from engines.onnx_backend import cuda_ep_available
from engines.registry import BACKENDS, EngineCheck, create_detector, doctor
from engines.tensorrt import availability as tensorrt_backend


def test_unknown_backend_lists_the_choices(fall_model: Path) -> None:
    with pytest.raises(ValueError, match="unknown detector backend 'gpu'.*auto, tensorrt, onnx-cuda, onnx-cpu"):
        create_detector(fall_model, "gpu")


def test_bad_thresholds_fail_before_loading(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="iou"):
        create_detector(tmp_path / "missing.onnx", iou=2.0)


def test_tensorrt_missing_package_is_named(fall_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        tensorrt_backend.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorrt" else real_find_spec(name, *a),
    )
    with pytest.raises(EngineUnavailable, match="'tensorrt' is not installed: pip install 'tensorrt>=10'"):
        create_detector(fall_model, "tensorrt")


def test_tensorrt_here(fall_model: Path) -> None:
    available, why = tensorrt_backend.tensorrt_available()
    if available:  # a GPU host: the backend must then really work
        detector = create_detector(fall_model, "tensorrt")
        assert detector.backend == "tensorrt"
        detector.close()
    else:
        with pytest.raises(EngineUnavailable, match="^tensorrt: ") as caught:
            create_detector(fall_model, "tensorrt")
        assert why in str(caught.value)


def test_onnx_cuda_here(fall_model: Path) -> None:
    available, _ = cuda_ep_available()
    if available:
        try:
            detector = create_detector(fall_model, "onnx-cuda")
        except EngineUnavailable as exc:  # EP present but no GPU / CUDA libraries
            assert "onnx-cuda" in str(exc)
        else:
            assert detector.backend == "onnxruntime-cuda"
            detector.close()
    else:
        with pytest.raises(EngineUnavailable, match="onnxruntime-gpu"):
            create_detector(fall_model, "onnx-cuda")


def test_auto_falls_back_to_an_available_backend(nudenet_model: Path) -> None:
    detector = create_detector(nudenet_model)
    try:
        expected = "onnxruntime-cpu"
        if tensorrt_backend.tensorrt_available()[0]:
            expected = "tensorrt"
        elif cuda_ep_available()[0]:
            expected = detector.backend  # CUDA EP or its CPU fallback, depending on the libraries
        assert detector.backend == expected
    finally:
        detector.close()


def test_doctor_reports_every_engine() -> None:
    checks = doctor()
    by_name = {check.name: check for check in checks}
    assert {"tensorrt", "onnxruntime-cuda", "onnxruntime-cpu", "faster-whisper"} <= by_name.keys()
    assert all(isinstance(check, EngineCheck) and check.detail for check in checks)
    assert by_name["onnxruntime-cpu"].available
    assert by_name["faster-whisper"].available, by_name["faster-whisper"].detail
    assert by_name["tensorrt"].available == tensorrt_backend.tensorrt_available()[0]
    if not by_name["tensorrt"].available:
        assert "install" in by_name["tensorrt"].detail or "GPU" in by_name["tensorrt"].detail


def test_doctor_explains_a_missing_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensorrt_backend, "cuda_device_count", lambda: (0, "no NVIDIA driver (libcuda not found)"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        tensorrt_backend.importlib.util,
        "find_spec",
        lambda name, *a: object() if name in ("tensorrt", "pycuda") else real_find_spec(name, *a),
    )
    (check,) = [c for c in doctor() if c.name == "tensorrt"]
    assert not check.available and "no NVIDIA driver" in check.detail


def test_backend_names_are_stable() -> None:
    assert BACKENDS == ("auto", "tensorrt", "onnx-cuda", "onnx-cpu")
