"""Typed errors raised by the model runtimes."""

from __future__ import annotations


class EngineError(Exception):
    """Base class for every engine failure."""


class ModelLoadError(EngineError, ValueError):
    """The model file is missing, is not ONNX, or is not a supported YOLO export (bad input)."""


class EngineUnavailable(EngineError):
    """The requested runtime cannot run on this machine (package, driver or device missing)."""
