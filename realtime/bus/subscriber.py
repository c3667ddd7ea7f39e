"""`vidsentry subscribe`: print live events as JSON lines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable
from typing import TextIO

import nats.errors

from realtime.bus.cloudevents import decode
from realtime.bus.connection import connect_nats, round_trip

log = logging.getLogger(__name__)

DEFAULT_SUBJECT = "vidsentry.>"
# A terminal or pipe that cannot keep up gets slow-consumer drops, not unbounded memory.
_PENDING_MSGS_LIMIT = 65_536
_PENDING_BYTES_LIMIT = 64 * 1024 * 1024


def check_subject(subject: str) -> str:
    """The subject if NATS can subscribe to it; ValueError saying why not. nats-py sends what it
    is given: `a b` would subscribe to `a` in queue group `b`."""
    if not subject:
        raise ValueError("the NATS subject is empty")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in subject):
        raise ValueError(f"invalid NATS subject {subject!r}: no spaces or control characters")
    tokens = subject.split(".")
    if not all(tokens):
        raise ValueError(f"invalid NATS subject {subject!r}: an empty token (a leading, trailing or double dot)")
    if ">" in tokens[:-1]:
        raise ValueError(f"invalid NATS subject {subject!r}: '>' must be the last token")
    return subject


def format_line(subject: str, headers: dict[str, str] | None, data: bytes) -> str:
    """One event as a compact JSON object: {"subject", "headers": {ce-*...}, "data": {...}}."""
    return json.dumps({"subject": subject, **decode(headers, data)}, ensure_ascii=False, separators=(",", ":"))


async def subscribe(
    url: str,
    subject: str = DEFAULT_SUBJECT,
    out: TextIO = sys.stdout,
    *,
    limit: int | None = None,
    duration: float | None = None,
    connect_timeout: float = 5.0,
    on_ready: Callable[[], None] | None = None,
) -> int:
    """Print each message on `subject` as one JSON line until `limit` messages or `duration`
    seconds (or cancellation). Returns how many were printed.

    Raises BusUnavailable when the server cannot be reached within `connect_timeout`, and
    ValueError for a malformed subject. Live messages only: nothing is replayed from JetStream.
    `on_ready` is called once the server has the subscription (e.g. to say "listening" on stderr).
    """
    check_subject(subject)
    if limit is not None and limit <= 0:
        return 0

    async def on_error(exc: Exception) -> None:
        log.warning("NATS: %s", exc)

    nc = await connect_nats(url, connect_timeout=connect_timeout, name="vidsentry-subscribe", error_cb=on_error)
    printed = 0
    try:
        try:
            sub = await nc.subscribe(
                subject, pending_msgs_limit=_PENDING_MSGS_LIMIT, pending_bytes_limit=_PENDING_BYTES_LIMIT
            )
        except nats.errors.BadSubjectError:
            raise ValueError(f"invalid NATS subject {subject!r}") from None
        await round_trip(nc)
        if on_ready is not None:
            on_ready()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(duration):
                async for msg in sub.messages:
                    try:
                        out.write(format_line(msg.subject, msg.headers, msg.data) + "\n")
                        out.flush()
                    except BrokenPipeError:  # `vidsentry subscribe | head`
                        break
                    printed += 1
                    if limit is not None and printed >= limit:
                        break
    finally:
        # close, not drain: drain would wait for messages we chose not to read.
        await nc.close()
    return printed
