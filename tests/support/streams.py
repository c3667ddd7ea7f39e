"""Stream specs for tests, built the way the service builds them (settings → stream_spec)."""

from __future__ import annotations

from typing import Any

from realtime.config import CameraStreamSettings
from realtime.sources.supervisor import SupervisorPolicy
from realtime.streams.spec import StreamSpec, stream_spec


def camera_spec(stream_id: str, url: str, *, policy: SupervisorPolicy | None = None, **settings: Any) -> StreamSpec:
    """A camera stream; `settings` are CameraStreamSettings fields (files play lossless unless realtime=True)."""
    settings.setdefault("realtime", False)
    return stream_spec(CameraStreamSettings(id=stream_id, url=url, **settings), policy=policy)
