"""TaskOwner: background tasks that live beside a loop rather than inside its TaskGroup.

A TaskGroup suits tasks that live and die together. Some tasks must not: a describer's VLM
request that hits a bug must not end the stream, and a publisher's retry loop that dies must be
seen (the publisher is then not `alive`) without taking the service down. Those are spawned on
a TaskOwner, which keeps each referenced until it ends, names it, and knows how long it has run
(`running`). A task that ends with an exception is logged once with its traceback and counted
(`crashes`); a `critical` one also marks the owner failed for good (`failure`, the first such
death). Cancelling is how the owner stops them (`cancel_all`, which waits for each), so a
cancelled task is no crash.

It is the one way to start a task outside a TaskGroup: `realtime/` calls no bare
`asyncio.create_task` or `ensure_future` (a test holds it to that). A task whose result someone
awaits (a render or a download several callers share) is spawned `awaited`: its failure goes to
them, so it is logged here at debug level only. `until_set` is the one race of a piece of work
against a stop event: whichever side loses is cancelled and awaited, never left behind.
`wait_set` is the one bounded wait for an event (not `asyncio.wait_for`, which can swallow a
cancellation before Python 3.12; ruff bans it outside tests), and `check_cancelled` ends a loop
whose cancel a library's `wait_for` swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def describe_error(exc: BaseException) -> str:
    """One line for an exception: its type and the first line of its message."""
    text = str(exc).splitlines()[0].strip() if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True, slots=True)
class _Spawned:
    critical: bool
    awaited: bool  # its result is awaited: a failure is the awaiter's to handle
    started: float  # time.monotonic()
    on_done: Callable[[asyncio.Task[Any]], None] | None


class TaskOwner:
    def __init__(self, owner: str) -> None:
        self.owner = owner  # "NATS publisher", "cam1 describer": in logs and reasons
        self.crashes = 0
        self._failure: str | None = None
        self._tasks: dict[asyncio.Task[Any], _Spawned] = {}  # running, in start order

    @property
    def failure(self) -> str | None:
        """Why the first critical task that died did (one line), or None while none has."""
        return self._failure

    def spawn(
        self,
        coro: Coroutine[Any, Any, T],
        name: str,
        *,
        critical: bool = True,
        awaited: bool = False,
        on_done: Callable[[asyncio.Task[Any]], None] | None = None,
    ) -> asyncio.Task[T]:
        """Start `coro` as a task named `name`; `on_done` runs when it ends, however it ends.
        `awaited`: the caller awaits its result, so a failure reaches it and is no crash here."""
        task = asyncio.create_task(coro, name=name)
        self._tasks[task] = _Spawned(critical and not awaited, awaited, time.monotonic(), on_done)
        task.add_done_callback(self._task_done)
        return task

    def running(self) -> list[tuple[str, float]]:
        """(name, seconds it has run) of every task still running, oldest first."""
        now = time.monotonic()
        return [(task.get_name(), now - spawned.started) for task, spawned in self._tasks.items()]

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel_all(self) -> None:
        """Cancel every task still running, in the order they were started, and wait for each. If
        the caller is cancelled meanwhile, the rest are cancelled without waiting and so is it."""
        tasks = list(self._tasks)
        try:
            for task in tasks:
                await cancel_and_wait(task)  # a crash is already logged
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        spawned = self._tasks.pop(task)
        try:
            if task.cancelled():
                return
            exc = task.exception()  # retrieving it also keeps asyncio from logging it again
            if exc is None:
                return
            if spawned.awaited:
                log.debug("%s task %s failed: %s", self.owner, task.get_name(), describe_error(exc))
                return
            self.crashes += 1
            reason = f"{task.get_name()} crashed: {describe_error(exc)}"
            if spawned.critical and self._failure is None:
                self._failure = reason
            log.error("%s task crashed: %s", self.owner, reason, exc_info=exc)
        finally:
            if spawned.on_done is not None:
                spawned.on_done(task)


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait until it has ended, however it ends (what it raised is its owner's
    to report). A cancellation of the caller meanwhile goes on up: awaiting the task inside
    `suppress(CancelledError)` cannot tell the two apart, and a stop whose own cancellation was
    swallowed went on running (a fleet watch watched again, and its owner waited for it forever)."""
    task.cancel()
    await asyncio.wait((task,))
    if not task.cancelled():
        task.exception()  # retrieved: asyncio does not log it again when the task is collected


async def wait_set(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until `event` is set or `seconds` pass (None: no bound); True when it is set. A cancellation of
    the caller always goes on up: `asyncio.wait_for` before Python 3.12 returns the inner result
    instead when the event is set in the same loop turn as the cancel, and a supervisor that lost
    its cancellation that way watched a wedged reader forever."""
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):  # asyncio.timeout tells its own expiry from a cancel
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


def check_cancelled() -> None:
    """Raise CancelledError when this task was cancelled and the cancel was lost on the way. A
    library's `asyncio.wait_for` (nats-py's requests, fetches and KV calls, before Python 3.12)
    returns its result instead when the reply lands in the cancel's loop turn. At the top of a loop
    that runs until cancelled, it ends such a loop at its next turn instead of never, and its owner
    stops waiting for it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def until_set(stop: asyncio.Event, work: Coroutine[Any, Any, T], name: str) -> tuple[bool, T | None]:
    """`(True, work's result)`, or `(False, None)` when `stop` is set before `work` ends; then `work`
    is cancelled and awaited. Whatever `work` raises reaches the caller."""
    owner = TaskOwner(name)
    task = owner.spawn(work, name, awaited=True)
    stopping = owner.spawn(stop.wait(), f"{name}-stop", awaited=True)
    try:
        await asyncio.wait((task, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        await owner.cancel_all()  # the loser; or both, when the caller is cancelled
    if task.cancelled():
        return False, None
    return True, task.result()
