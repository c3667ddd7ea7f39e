"""One nats-server and one RTSP server for the fleet tests (module scope: the workers outlive a test)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.nats import running_server
from tests.support.rtsp import RtspServer


@pytest.fixture(scope="module")
def fleet_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    yield from running_server(tmp_path_factory.mktemp("fleet-nats"))


@pytest.fixture(scope="module")
def live_rtsp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RtspServer]:
    """/test: an endless live 320x240 source, encoded once for every client."""
    server = RtspServer(log_path=tmp_path_factory.mktemp("rtsp") / "rtsp_server.log")
    try:
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.close()


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet")
