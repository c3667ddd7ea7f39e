"""Mailbox and audio buffer: bounded, counted, correct across threads."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from pipelines.frames import AudioChunk, VideoFrame
from pipelines.mailbox import AudioBuffer, FrameMailbox, MailboxClosed

IMG = np.zeros((4, 4, 3), np.uint8)


def frame(seq: int) -> VideoFrame:
    return VideoFrame("cam", seq, seq / 10, 0.0, IMG)


async def test_latest_frame_wins_and_drops_are_counted() -> None:
    box = FrameMailbox()
    for i in range(5):
        assert box.put(frame(i))
    got = await box.get()
    assert got.seq == 4
    assert (box.stats.put, box.stats.taken, box.stats.dropped) == (5, 1, 4)
    assert box.pending() == 0


async def test_blocking_mode_loses_nothing_with_a_slow_consumer() -> None:
    box = FrameMailbox(blocking=True)
    n = 200

    def produce() -> None:
        for i in range(n):
            assert box.put(frame(i), timeout=10)
        box.close()

    thread = threading.Thread(target=produce)
    thread.start()
    seen = []
    while True:
        try:
            seen.append((await box.get()).seq)
        except MailboxClosed:
            break
        if len(seen) % 50 == 0:
            await asyncio.sleep(0.01)
    await asyncio.to_thread(thread.join)
    assert seen == list(range(n))
    assert box.stats.dropped == 0


async def test_close_wakes_waiting_consumer_and_refuses_new_frames() -> None:
    box = FrameMailbox()
    waiter = asyncio.create_task(box.get())
    await asyncio.sleep(0.01)
    box.close()
    with pytest.raises(MailboxClosed):
        await asyncio.wait_for(waiter, 1)
    assert box.put(frame(1)) is False


async def test_blocking_put_unblocks_on_close() -> None:
    box = FrameMailbox(blocking=True)
    box.put(frame(0))
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(box.put(frame(1), timeout=30)))
    thread.start()
    await asyncio.sleep(0.05)
    box.close()
    await asyncio.to_thread(thread.join, 5)
    assert result == [False]


def chunk(pts: float, seconds: float = 0.5) -> AudioChunk:
    return AudioChunk("cam", pts, 0.0, np.zeros(int(16000 * seconds), np.float32))


async def test_audio_buffer_is_bounded_by_duration_and_counts_drops() -> None:
    buf = AudioBuffer(max_seconds=2.0)
    for i in range(10):
        buf.put(chunk(i * 0.5))
    assert buf.buffered_seconds <= 2.0
    got = await buf.get_many()
    assert [c.pts for c in got] == [3.0, 3.5, 4.0, 4.5]
    assert buf.stats.chunks_dropped == 6
    assert buf.stats.seconds_dropped == pytest.approx(3.0)
    buf.close()
    with pytest.raises(MailboxClosed):
        await buf.get_many()
