"""Ingest: turn files, RTSP and HTTP sources into frames and audio, and keep them flowing.

    spec = parse_source(url)                       # InvalidSource on a bad URL / path
    supervisor = CameraSupervisor(stream_id, spec, video=mailbox, audio=buffer, on_status=cb)
    state = await supervisor.run()                 # STOPPED or FAILED; supervisor.stop() ends it

Backends: "pyav" (default, FFmpeg) and "gstreamer" (optional, needs PyGObject).
"""

from realtime.sources.backends import BACKENDS, create_session, normalize_backend
from realtime.sources.pacing import RealtimePacer
from realtime.sources.session import BackendUnavailable, SessionOptions, SourceError, SourceSession
from realtime.sources.spec import InvalidSource, SourceSpec, parse_source
from realtime.sources.supervisor import CameraSupervisor, SourceStats, SupervisorPolicy

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "CameraSupervisor",
    "InvalidSource",
    "RealtimePacer",
    "SessionOptions",
    "SourceError",
    "SourceSession",
    "SourceSpec",
    "SourceStats",
    "SupervisorPolicy",
    "create_session",
    "normalize_backend",
    "parse_source",
]
