"""TaskOwner: tasks beside a loop are named, watched, reported when they crash, and cancelled."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pipelines.tasks import TaskOwner, cancel_and_wait, check_cancelled, describe_error, until_set, wait_set


async def test_crashes_are_logged_and_counted_and_only_a_critical_one_fails_the_owner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = TaskOwner("cam1 describer")
    ended: list[str] = []
    gate = asyncio.Event()

    async def crash(what: str) -> None:
        raise RuntimeError(f"{what} broke\nsecond line")

    async def wait() -> None:
        await gate.wait()

    owner.spawn(crash("request"), "cam1-describe", critical=False, on_done=lambda t: ended.append(t.get_name()))
    owner.spawn(wait(), "cam1-wait")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert ended == ["cam1-describe"] and owner.crashes == 1 and owner.failure is None
    assert [name for name, _ in owner.running()] == ["cam1-wait"] and len(owner) == 1
    critical = owner.spawn(crash("loop"), "nats-retry")
    with pytest.raises(RuntimeError):
        await critical
    await asyncio.sleep(0)
    assert owner.crashes == 2 and owner.failure == "nats-retry crashed: RuntimeError: loop broke"
    assert sum("task crashed" in r.getMessage() and r.exc_info is not None for r in caplog.records
               if r.levelno == logging.ERROR) == 2
    await owner.cancel_all()  # waits for each: nothing is left running, a cancel is no crash
    assert len(owner) == 0 and owner.crashes == 2


def test_an_error_is_described_in_one_line() -> None:
    assert describe_error(ValueError("bad\nmore")) == "ValueError: bad"
    assert describe_error(TimeoutError()) == "TimeoutError"


async def test_a_task_whose_result_is_awaited_hands_its_failure_to_the_awaiter_not_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = TaskOwner("previews")

    async def encode() -> int:
        raise ValueError("bad frame")

    with pytest.raises(ValueError, match="bad frame"):
        await owner.spawn(encode(), "cam1-preview", awaited=True)
    await asyncio.sleep(0)
    assert owner.crashes == 0 and owner.failure is None and len(owner) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_until_set_races_work_against_a_stop_and_leaves_no_loser_behind() -> None:
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def answer() -> str:
        return "ok"

    async def hang() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    async def refuse() -> str:
        raise LookupError("refused")

    assert await until_set(stop, answer(), "answer") == (True, "ok")
    with pytest.raises(LookupError):
        await until_set(stop, refuse(), "refuse")
    asyncio.get_running_loop().call_later(0.01, stop.set)
    assert await until_set(stop, hang(), "hang") == (False, None)
    assert cancelled.is_set()  # cancelled and awaited before until_set returned


async def test_a_caller_cancelled_while_it_waits_for_its_tasks_to_end_is_cancelled_too() -> None:
    """cancel_all used to await each task inside suppress(CancelledError), which also swallowed a
    cancellation of the caller: a stop that was itself cancelled carried on as if it had ended."""
    owner = TaskOwner("test")
    ending, release = asyncio.Event(), asyncio.Event()

    async def slow_to_end() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ending.set()
            await release.wait()  # its clean-up takes a while

    owner.spawn(slow_to_end(), "slow")
    await asyncio.sleep(0)
    stopping = asyncio.create_task(owner.cancel_all())
    await ending.wait()  # the stop is waiting for the task's end
    stopping.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert stopping.cancelled()


async def test_cancel_and_wait_waits_for_the_end_and_keeps_the_tasks_error_to_itself() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("clean-up failed") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.done() and isinstance(task.exception(), RuntimeError)


async def test_wait_set_says_whether_the_event_came_and_never_swallows_a_cancel() -> None:
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await wait_set(event, 0.05) is False and loop.time() - started >= 0.05
    loop.call_later(0.01, event.set)
    assert await wait_set(event, 30) is True
    assert await wait_set(event, 0) is True  # already set
    event.clear()
    loop.call_later(0.01, event.set)
    assert await wait_set(event, None) is True  # no bound

    # The event set and the waiter cancelled in one loop turn: asyncio.wait_for (Python 3.11)
    # returns the event's result here and the cancel is lost; wait_set lets it go on up.
    for wait in (lambda e: wait_set(e, 30), lambda e: wait_set(e, 0.001)):
        event = asyncio.Event()
        waiter = asyncio.create_task(wait(event))
        await asyncio.sleep(0)  # it waits now
        event.set()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter


async def test_check_cancelled_ends_a_loop_whose_cancel_a_library_swallowed() -> None:
    """What nats-py does on Python 3.11: its reply wait is an asyncio.wait_for, which returns the
    reply instead of raising when the reply lands in the cancel's loop turn."""
    replied = asyncio.Event()

    async def until_cancelled(check: bool) -> None:
        while True:
            if check:
                check_cancelled()
            await asyncio.wait_for(replied.wait(), 30)  # the library's request
            replied.clear()

    for check in (False, True):
        loop_task = asyncio.create_task(until_cancelled(check))
        await asyncio.sleep(0)  # it waits for its first reply
        replied.set()
        loop_task.cancel()
        done, _ = await asyncio.wait((loop_task,), timeout=0.2)
        if check:
            assert done and loop_task.cancelled()
        else:  # the cancel was lost: the loop waits for its next reply as if never cancelled
            assert not done and loop_task.cancelling() == 1
            loop_task.cancel()
            await asyncio.wait((loop_task,))
