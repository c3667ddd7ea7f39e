"""Pick a reader backend by name."""

from __future__ import annotations

from realtime.sources.session import SessionOptions, SourceSession
from realtime.sources.spec import SourceSpec

BACKENDS = ("pyav", "gstreamer")
_ALIASES = {"pyav": "pyav", "av": "pyav", "ffmpeg": "pyav", "gstreamer": "gstreamer", "gst": "gstreamer"}


def normalize_backend(name: str) -> str:
    """The canonical backend name; ValueError naming the choices for anything else."""
    backend = _ALIASES.get(name.strip().lower()) if isinstance(name, str) else None
    if backend is None:
        raise ValueError(f"unknown source backend {name!r}: use one of {', '.join(BACKENDS)}")
    return backend


def create_session(backend: str, spec: SourceSpec, options: SessionOptions) -> SourceSession:
    """A new, unopened session. GStreamer is imported only when it is asked for."""
    if normalize_backend(backend) == "gstreamer":
        from realtime.sources.gst_source import GstSession

        return GstSession(spec, options)
    from realtime.sources.pyav_source import PyAVSession

    return PyAVSession(spec, options)
