"""`round_trip` returns only after the server has read what the client issued before it.

A TCP relay between a real nats-py client and a real nats-server records the bytes the client
sends, so the order of SUB and PING on the wire is observed rather than assumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import nats.aio.client
import pytest
from nats.aio.client import Client as NatsClient

from realtime.bus.connection import connect_nats, round_trip
from realtime.bus.embedded import EmbeddedNatsServer

pytestmark = pytest.mark.timeout(30)


@contextlib.asynccontextmanager
async def relay(upstream_port: int, sent: bytearray) -> AsyncIterator[int]:
    """A local port that forwards to `upstream_port`, appending every client byte to `sent`."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, record: bool) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                if record:
                    sent.extend(chunk)
                writer.write(chunk)
                await writer.drain()
        writer.close()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(pipe(reader, up_writer, record=True))
            tg.create_task(pipe(up_reader, writer, record=False))

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def sent_before_the_last_pong(settle: Callable[[NatsClient], Awaitable[None]], url_port: int) -> bytes:
    """Subscribe, settle, and return what the client had sent before the PING answered last."""
    sent = bytearray()
    async with relay(url_port, sent) as port:
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        try:
            await nc.subscribe("wire.order.>")
            await settle(nc)
            return bytes(sent[: sent.rindex(b"PING\r\n")])
        finally:
            await nc.close()


async def test_a_subscription_is_on_the_wire_before_the_ping_that_confirms_it(nats_server: EmbeddedNatsServer) -> None:
    port = int(nats_server.url.rsplit(":", 1)[1])
    assert b"SUB wire.order.>" in await sent_before_the_last_pong(round_trip, port)


async def test_one_flush_alone_can_confirm_before_the_subscription_is_sent(nats_server: EmbeddedNatsServer) -> None:
    # Why round_trip exists: if nats-py ever orders its PING behind pending commands, this fails
    # and round_trip can become a single flush again.
    port = int(nats_server.url.rsplit(":", 1)[1])

    async def flush(nc: NatsClient) -> None:
        await nc.flush()

    assert b"SUB wire.order.>" not in await sent_before_the_last_pong(flush, port)


async def test_a_frozen_server_first_in_the_list_leaves_time_for_the_next(
    nats_server: EmbeddedNatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen nats-server (SIGSTOP, a hung VM) still accepts TCP, in the kernel, and then says
    nothing. Tried first, it must not use up the whole connect bound: the next server of the
    list, which answers, gets its turn (a `serve` started while one node of a cluster hangs)."""
    monkeypatch.setattr(nats.aio.client, "shuffle", lambda pool: None)  # the list's order, as written
    tries: list[float] = []  # each server's connect timeout, as nats-py is given it
    connect = nats.aio.client.Client.connect

    async def spied(self: NatsClient, *args: Any, **options: Any) -> None:
        tries.append(options["connect_timeout"])
        await connect(self, *args, **options)

    monkeypatch.setattr(nats.aio.client.Client, "connect", spied)
    with EmbeddedNatsServer(store_dir=tmp_path / "frozen") as frozen:
        assert frozen.pid is not None
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            nc = await connect_nats(f"{frozen.url},{nats_server.url}", connect_timeout=5.0, name="test")
            try:
                # Within the bound (else BusUnavailable), because the frozen one had only its share.
                assert nc.connected_url is not None and nc.connected_url.port == nats_server.port
                assert len(tries) == 1 and tries[0] <= 5.0 / 2
            finally:
                await nc.close()
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
