"""The project's one exception root, and the engines layer's root under it.

Every exception the project defines derives from `VidsentryError` through its layer's root:
`EngineError` here, `pipelines.errors.PipelineError`, `realtime.errors.ServiceError`. The root lives
in the lowest layer so every layer can import it. A class that callers already catch as a builtin
(ValueError, TimeoutError, OSError, ...) keeps that base beside its root. Third-party errors are
never subclassed: a failure of a library is raised as one of ours, `from` the library's error, so
our API does not change when the library's does.
"""

from __future__ import annotations


class VidsentryError(Exception):
    """Base class of every exception vidsentry defines."""


class EngineError(VidsentryError):
    """Base class for every engine failure (the engines layer's root)."""


class ModelLoadError(EngineError, ValueError):
    """The model file is missing, is not ONNX, or is not a supported YOLO export (bad input)."""


class EngineUnavailable(EngineError):
    """The requested runtime cannot run on this machine (package, driver or device missing)."""
