"""BusLink: the publisher's connection to NATS, and the VIDSENTRY stream on it.

It holds the nats-py client and its JetStream context while connected, whether the publisher is
closed, and whether the stream has answered since the last (re)connect. A broker restarted
without its store, or a stream deleted under a live connection, has lost the stream:
`start_reconcile` makes it again in the background, retrying with back-off while the connection
lasts, and calls `on_stream_ready` once it answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext

from realtime.bus.delivery import RETRY_BACKOFF_S
from realtime.bus.jetstream import StreamSetup
from realtime.bus.ledger import DeliveryLedger
from realtime.bus.supervisor import TaskSupervisor


class BusLink:
    def __init__(
        self,
        *,
        ensure_stream: Callable[[], Awaitable[StreamSetup]],
        on_stream_ready: Callable[[], None],
        ledger: DeliveryLedger,
        supervisor: TaskSupervisor,
    ) -> None:
        self.nc: NatsClient | None = None
        self.js: JetStreamContext | None = None
        self.closed = False
        self.stream_ready = False  # the stream answered since the last (re)connect
        self._ensure_stream = ensure_stream
        self._on_stream_ready = on_stream_ready
        self._ledger = ledger
        self._supervisor = supervisor
        self._reconcile_task: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    def start_reconcile(self) -> None:
        if self._reconcile_task is None or self._reconcile_task.done():
            self._reconcile_task = self._supervisor.spawn(self._reconcile_stream(), name="nats-stream-reconcile")

    async def _reconcile_stream(self) -> None:
        attempt = 0
        while not self.closed:
            try:
                await self._ensure_stream()
            except Exception as exc:
                self._ledger.stats.last_error = f"ensure_stream after reconnect: {exc}"
                self._ledger.log_error_once(f"could not ensure stream after reconnect: {exc}")
                if not self.connected:
                    return  # the next reconnect tries again
                await asyncio.sleep(RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)])
                attempt += 1
                continue
            self.stream_ready = True
            self._on_stream_ready()
            return
