"""A JetStream context whose `publish_async` futures also receive the broker's refusals.

nats-py (2.x) answers a JetStream error reply to `publish_async` (message too large for the
stream, a wrong expected stream, ...) by raising the APIError inside its reply handler, which
ends up in the connection's error callback; the future is never resolved and only times out.
A refusal then looks like a lost ack: retried as if the broker were slow, counted late, and the
caller waits `ack_timeout` for each. Here the APIError is set on the future instead, so a refusal
arrives at once, as the permanent failure it is.

This reads two private attributes of nats-py's context (the reply prefix and the futures map);
should they change shape, the reply is handled exactly as nats-py does it (no worse than before).
"""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.errors import APIError


class ErrorAwareJetStream(JetStreamContext):
    async def _handle_async_reply(self, msg: Msg) -> None:
        try:
            await super()._handle_async_reply(msg)
        except APIError as exc:
            future = self._reply_future(msg.subject)
            if future is None:
                raise
            if not future.done():
                future.set_exception(exc)

    def _reply_future(self, subject: str) -> asyncio.Future[object] | None:
        prefix = getattr(self, "_async_reply_prefix", None)
        futures = getattr(self, "_publish_async_futures", None)
        if not isinstance(prefix, bytes | bytearray) or not isinstance(futures, dict):
            return None
        future = futures.get(subject[len(prefix) :])
        return future if isinstance(future, asyncio.Future) else None
