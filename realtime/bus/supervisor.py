"""TaskSupervisor: the publisher's background tasks, and whether one of them died.

A task started with `spawn` that ends with an exception is logged once with its traceback,
counted, and marks the owner unhealthy for good: `failure` says why (the first death) and the
owner reports itself not alive. Cancelling is how the owner stops them (`cancel_all`), so a
cancelled task is not a death. Tasks are kept referenced until they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from realtime.bus.ledger import describe

log = logging.getLogger(__name__)


class TaskSupervisor:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.deaths = 0
        self._failure: str | None = None
        self._tasks: dict[asyncio.Task[None], None] = {}  # running, in start order

    @property
    def failure(self) -> str | None:
        """Why the first task that died did (one line), or None while none has."""
        return self._failure

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks[task] = None
        task.add_done_callback(self._task_done)
        return task

    async def cancel_all(self) -> None:
        """Cancel every task still running, in the order they were started, and wait for each."""
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a death is already logged
                await task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        if task.cancelled():
            return
        exc = task.exception()  # retrieving it also keeps asyncio from logging it again
        if exc is None:
            return
        self.deaths += 1
        reason = f"{task.get_name()} crashed: {describe(exc)}"
        if self._failure is None:
            self._failure = reason
        log.error("%s background task died: %s", self.owner, reason, exc_info=exc)
