"""Bounded connection set-up shared by the publisher and the subscriber."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import urlsplit

from nats.aio.client import Client as NatsClient

from realtime.errors import ServiceError

log = logging.getLogger(__name__)

_DEFAULT_PORTS = {"nats": 4222, "tls": 4222, "ws": 80, "wss": 443}
_POLL_INTERVAL_S = 0.05
# A frozen server accepts TCP (the kernel does) and then says nothing: one try of one server of a
# list gets a share of the connect bound, never less than this, so the next one gets its turn.
_MIN_TRY_S = 2.0


class BusUnavailable(ServiceError, ConnectionError):
    """The NATS server could not be reached (or used) within the connect bound."""


def split_servers(url: str) -> list[str]:
    """nats-py accepts a comma-separated server list; so do we."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError("empty NATS url")
    return [s if "://" in s else f"nats://{s}" for s in servers]


def redact_url(url: str) -> str:
    """The url with user, password or token replaced by `***`, safe for logs and errors."""
    redacted = []
    for server in url.split(","):
        parts = urlsplit(server.strip() if "://" in server else f"nats://{server.strip()}")
        if parts.username is not None or parts.password is not None:
            host = parts.netloc.rsplit("@", 1)[1]
            parts = parts._replace(netloc=f"***@{host}")
        redacted.append(parts.geturl())
    return ",".join(redacted)


def _host_port(server: str) -> tuple[str, int]:
    parts = urlsplit(server)
    return parts.hostname or "127.0.0.1", parts.port or _DEFAULT_PORTS.get(parts.scheme, 4222)


async def wait_for_port(servers: list[str], deadline: float) -> None:
    """Poll until one server accepts TCP, so nats-py never enters its 2 s reconnect back-off
    on the first connect. Raises OSError with the last failure at the deadline."""
    last: BaseException | None = None
    while True:
        for server in servers:
            host, port = _host_port(server)
            remaining = deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(remaining, 0.01)):
                    _, writer = await asyncio.open_connection(host, port)
            except (OSError, TimeoutError) as exc:
                last = exc
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        if time.monotonic() + _POLL_INTERVAL_S >= deadline:
            reason = (str(last) or type(last).__name__) if last is not None else "timed out"
            raise OSError(reason)
        await asyncio.sleep(_POLL_INTERVAL_S)


async def connect_nats(
    url: str,
    *,
    connect_timeout: float,
    name: str,
    reconnect_wait: float = 1.0,
    disconnected_cb: Callable[[], Awaitable[None]] | None = None,
    reconnected_cb: Callable[[], Awaitable[None]] | None = None,
    error_cb: Callable[[Exception], Awaitable[None]] | None = None,
    closed_cb: Callable[[], Awaitable[None]] | None = None,
    drain_timeout: float = 5.0,
    pending_size: int | None = None,
) -> NatsClient:
    """A connected client that reconnects forever, or BusUnavailable within `connect_timeout` s.

    `pending_size=0` turns off nats-py's reconnect buffer: publishing while disconnected raises
    OutboundBufferLimitError at once (for callers that keep such messages themselves)."""
    servers = split_servers(url)
    shown = redact_url(url)
    deadline = time.monotonic() + connect_timeout
    try:
        await wait_for_port(servers, deadline)
    except OSError as exc:
        raise BusUnavailable(f"NATS server {shown} unreachable within {connect_timeout:g} s: {exc}") from None

    last_error: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        last_error.append(exc)
        if error_cb is not None:
            await error_cb(exc)

    nc = NatsClient()
    options: dict[str, Any] = {
        "servers": servers,
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,  # an outage must never end publishing for good
        # nats-py annotates these as int but uses them as float seconds.
        "reconnect_time_wait": cast(int, reconnect_wait),
        # Each server's try (and each later reconnect's): a share of the bound, so a frozen server
        # first in the list cannot use all of it.
        "connect_timeout": cast(int, max(min(deadline - time.monotonic(),
                                             max(connect_timeout / len(servers), _MIN_TRY_S)), 0.1)),
        # Detect a half-open connection in about a minute instead of the default four.
        "ping_interval": 20,
        "max_outstanding_pings": 3,
        "drain_timeout": cast(int, drain_timeout),
        "error_cb": on_error,
        "disconnected_cb": disconnected_cb,
        "reconnected_cb": reconnected_cb,
        "closed_cb": closed_cb,
    }
    if pending_size is not None:
        options["pending_size"] = pending_size
    try:
        async with asyncio.timeout(max(deadline - time.monotonic(), 0.1)):
            await nc.connect(**options)
    except asyncio.CancelledError:
        await _close_quietly(nc)
        raise
    except Exception as exc:
        # With max_reconnect_attempts=-1 the first connect retries forever: stop it.
        await _close_quietly(nc)
        reason = last_error[-1] if last_error else exc
        detail = str(reason) or type(reason).__name__
        raise BusUnavailable(f"NATS server {shown} unusable within {connect_timeout:g} s: {detail}") from None
    return nc


async def _close_quietly(nc: NatsClient) -> None:
    try:
        await nc.close()
    except Exception as exc:  # closing a half-built client: nothing more to do
        log.debug("closing NATS client after failed connect: %r", exc)


_PUBLISH_COMMANDS = (b"PUB ", b"HPUB ")


def discard_unsent_publishes(nc: NatsClient) -> int:
    """Forget publishes nats-py still holds unsent after its connection broke; returns how many.

    nats-py writes its pending buffer out first thing after a reconnect. A caller that re-sends
    everything unacknowledged itself, in order, needs those stale copies gone: one of them could
    otherwise reach the broker ahead of an older message that was lost with the connection.
    nats-py has no public call for this, so this touches two private attributes and does nothing
    (returns 0) if they ever change shape. Only call it while `nc` is not connected.
    """
    pending = getattr(nc, "_pending", None)
    size = getattr(nc, "_pending_data_size", None)
    if nc.is_connected or not isinstance(pending, list) or not isinstance(size, int):
        return 0
    keep = [cmd for cmd in pending if not (isinstance(cmd, bytes | bytearray) and cmd.startswith(_PUBLISH_COMMANDS))]
    dropped = len(pending) - len(keep)
    if dropped:
        pending[:] = keep
        nc._pending_data_size = sum(len(cmd) for cmd in keep)
    return dropped


async def round_trip(nc: NatsClient) -> None:
    """Return once the server has processed every command this client issued before the call:
    a subscription made just before now has the server's interest.

    One `flush()` does not promise that in nats-py 2.16: it writes its PING straight to the
    socket, while SUB and PUB commands wait in the client's buffer for its flusher task, so the
    PONG can come back before the server has read a SUB issued just before it. A message another
    client publishes in that gap is lost to the new subscriber. The flusher is woken before any
    PONG can be read, so after the first round trip the buffer is on the socket and the second
    PING follows it.
    """
    await nc.flush()
    await nc.flush()
