"""Fixtures for the ingest tests: the real RTSP server and the two reader backends."""

from __future__ import annotations

import pytest

from tests.support.rtsp import rtsp_server

__all__ = ["backend", "rtsp_server"]


@pytest.fixture(params=["pyav", "gstreamer"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
