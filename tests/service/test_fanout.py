"""The SSE fan-out: bounded per-viewer queues in front of the publisher."""

from __future__ import annotations

import asyncio
import json

import pytest

from pipelines.events import Event, EventKind
from realtime.bus import cloudevents
from realtime.streams.fanout import EventFanout, SseMessage, Viewer, ViewerClosed


class ListSink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event) -> None:
        self.events.append(event)


def event(stream_id: str, n: int, kind: EventKind = EventKind.DETECTIONS) -> Event:
    return Event(kind, stream_id, pts=n / 10, captured_at=1_800_000_000.0 + n, data={"frame_seq": n})


def test_sse_message_wire_format() -> None:
    assert SseMessage("status", '{"a": 1}', id="e1").encode() == b'id: e1\nevent: status\ndata: {"a": 1}\n\n'
    assert SseMessage("x", "one\ntwo").encode() == b"event: x\ndata: one\ndata: two\n\n"


async def test_a_slow_viewer_loses_its_oldest_events_and_counts_them() -> None:
    viewer = Viewer("cam", limit=3)
    for n in range(5):
        viewer.offer(SseMessage("detections", str(n)))
    assert viewer.dropped == 2 and viewer.depth == 3
    assert [(await viewer.next(0.1)).data for _ in range(3)] == ["2", "3", "4"]  # type: ignore[union-attr]
    assert await viewer.next(0.05) is None  # nothing within the heartbeat interval


async def test_a_closed_viewer_hands_out_what_is_queued_then_ends() -> None:
    viewer = Viewer("cam", limit=8)
    viewer.offer(SseMessage("status", "stopped"))
    viewer.close()
    viewer.offer(SseMessage("status", "too late"))
    assert (await viewer.next(1)).data == "stopped"  # type: ignore[union-attr]
    with pytest.raises(ViewerClosed):
        await viewer.next(1)


async def test_a_waiting_viewer_wakes_on_close() -> None:
    viewer = Viewer("cam", limit=8)
    waiter = asyncio.create_task(viewer.next(30))
    await asyncio.sleep(0.01)
    viewer.close()
    with pytest.raises(ViewerClosed):
        await asyncio.wait_for(waiter, 1)


async def test_fanout_forwards_everything_and_copies_a_streams_events_to_its_viewers() -> None:
    sink = ListSink()
    fanout = EventFanout(sink, node="n1", queue_limit=2)
    with fanout.watch("cam") as cam_viewer, fanout.watch("other") as other_viewer:
        assert fanout.viewer_count == 2
        for n in range(3):
            await fanout.publish(event("cam", n))
        await fanout.publish(event("elsewhere", 9))
        assert len(sink.events) == 4  # the publisher gets every event, watched or not
        assert other_viewer.depth == 0 and cam_viewer.dropped == 1
        message = await cam_viewer.next(0.1)
        assert message is not None and message.event == "detections"
        body = json.loads(message.data)
        payload, headers = cloudevents.encode(sink.events[1], "n1", 0.0)
        expected = json.loads(payload)
        assert message.id == headers["ce-id"]
        assert {k: v for k, v in body.items() if k != "published_at"} == {
            k: v for k, v in expected.items() if k != "published_at"
        }
    assert fanout.viewer_count == 0
    assert fanout.dropped_total == 1  # viewers that left still count


async def test_close_stream_and_close_end_viewers() -> None:
    fanout = EventFanout(ListSink(), node="n1")
    with fanout.watch("a") as a, fanout.watch("b") as b:
        fanout.close_stream("a")
        with pytest.raises(ViewerClosed):
            await a.next(0.1)
        assert await b.next(0.01) is None
        fanout.close()
        with pytest.raises(ViewerClosed):
            await b.next(0.1)
    with fanout.watch("c") as late, pytest.raises(ViewerClosed):  # after close(), new viewers end at once
        await late.next(0.1)
