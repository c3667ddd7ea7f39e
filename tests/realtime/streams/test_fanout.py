"""The SSE fan-out: bounded per-viewer queues in front of the publisher."""

from __future__ import annotations

import asyncio
import json

import pytest

from pipelines.events import Event, EventKind
from realtime.bus import cloudevents
from realtime.http.resume import ResumeSettings, resume
from realtime.streams.fanout import (
    MAX_OPEN_ALERTS,
    RECENT_DURABLE,
    EventFanout,
    SseMessage,
    Viewer,
    ViewerClosed,
    ViewerLimitReached,
)
from tests.support.bodies import alert_event, any_event
from tests.support.sinks import ListSink


def event(stream_id: str, n: int, kind: EventKind = EventKind.DETECTIONS) -> Event:
    return any_event(kind, stream_id, {"frame_seq": n}, pts=n / 10, captured_at=1_800_000_000.0 + n)


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


async def test_viewers_are_capped_per_stream_and_a_leaver_frees_its_slot() -> None:
    fanout = EventFanout(ListSink(), node="n1", max_viewers_per_stream=2, max_viewers=10)
    with fanout.watch("cam"), fanout.watch("cam") as second:
        with pytest.raises(ViewerLimitReached, match="http.sse_max_viewers_per_stream") as refused, fanout.watch("cam"):
            pytest.fail("a third viewer of cam was let in")
        assert refused.value.limit == 2 and refused.value.setting == "http.sse_max_viewers_per_stream"
        assert "2 viewers of stream 'cam'" in str(refused.value)
        assert fanout.viewer_count == 2 and fanout.rejected == 1
        with fanout.watch("other"):  # another stream has its own slots
            assert fanout.viewer_count == 3
        await fanout.publish(event("cam", 1))
        assert second.depth == 1  # the refused viewer left nothing behind
    with fanout.watch("cam"), fanout.watch("cam"):  # both slots free again
        assert fanout.viewer_count == 2
    assert fanout.viewer_count == 0 and fanout.rejected == 1


async def test_viewers_are_capped_in_total() -> None:
    fanout = EventFanout(ListSink(), node="n1", max_viewers_per_stream=5, max_viewers=2)
    with fanout.watch("a"), fanout.watch("b"):
        for stream_id in ("a", "c"):  # a watched stream and a new one alike
            total = r"2 viewers in total \(http.sse_max_viewers\)"
            with pytest.raises(ViewerLimitReached, match=total) as refused, fanout.watch(stream_id):
                pytest.fail("a viewer past the total was let in")
            assert refused.value.limit == 2 and refused.value.setting == "http.sse_max_viewers"
        assert fanout.rejected == 2 and fanout.viewer_count == 2
    with fanout.watch("c"):
        assert fanout.viewer_count == 1


async def test_a_capped_viewer_still_drops_its_oldest_events() -> None:
    fanout = EventFanout(ListSink(), node="n1", queue_limit=2, max_viewers_per_stream=1, max_viewers=1)
    with fanout.watch("cam") as viewer:
        for n in range(5):
            await fanout.publish(event("cam", n))
        assert viewer.depth == 2 and viewer.dropped == 3 and fanout.dropped_total == 3


def test_viewer_limits_below_one_are_refused() -> None:
    for limits in ({"max_viewers_per_stream": 0}, {"max_viewers": 0}):
        with pytest.raises(ValueError, match="viewer limits"):
            EventFanout(ListSink(), node="n1", **limits)


# -- resuming: the SSE id, the recent durable events, and the splice without JetStream ------------


async def test_the_sse_id_of_a_live_event_is_the_durable_event_before_it() -> None:
    fanout = EventFanout(ListSink(), node="n1")
    with fanout.watch("cam") as viewer:
        await fanout.publish(event("cam", 0))  # no durable event yet: no id line at all
        status = event("cam", 1, EventKind.STATUS)
        await fanout.publish(status)
        await fanout.publish(event("cam", 2))
        first, second, third = [await viewer.next(0.1) for _ in range(3)]
    assert first is not None and second is not None and third is not None
    assert b"id:" not in first.encode() and first.id  # the ce-id is known, just not sent
    assert second.encode().startswith(f"id: {status.id}\n".encode())
    assert third.encode().startswith(f"id: {status.id}\n".encode()) and third.id != status.id


async def test_recent_durable_events_are_bounded_and_go_with_their_stream() -> None:
    fanout = EventFanout(ListSink(), node="n1")
    for n in range(RECENT_DURABLE + 10):
        await fanout.publish(event("cam", n, EventKind.TRACKS))
        await fanout.publish(event("cam", n))  # live-only events are not kept
    recent = fanout.recent("cam")
    assert len(recent) == RECENT_DURABLE and recent[-1].data["frame_seq"] == RECENT_DURABLE + 9
    assert all(e.kind is EventKind.TRACKS for e in recent)
    fanout.close_stream("cam")
    assert fanout.recent("cam") == []


async def test_without_jetstream_a_resume_comes_from_the_recent_events() -> None:
    fanout = EventFanout(ListSink(), node="n1")
    events = [event("cam", n, EventKind.ALERTS) for n in range(6)]
    for e in events:
        await fanout.publish(e)
    settings = ResumeSettings(window_s=600, max_events=3)
    recent = fanout.recent("cam")
    found = await resume(events[1].id, "cam", recent=recent, fanout=fanout, history=None, settings=settings)
    assert [m.id for m in found.messages] == [e.id for e in events[3:]]  # the newest three of four
    assert found.summary["found"] and found.summary["skipped"] == 1 and found.sent == {e.id for e in events[3:]}
    gone = await resume("older", "cam", recent=recent, fanout=fanout, history=None, settings=settings)
    assert gone.messages == [] and gone.summary["found"] is False
    bad = await resume("two words", "cam", recent=recent, fanout=fanout, history=None, settings=settings)
    assert bad.summary == {**bad.summary, "found": False, "reason": "not an event id"}


async def test_open_alerts_are_bounded_per_stream_and_the_forgotten_counted() -> None:
    fanout = EventFanout(ListSink(), node="n1")
    for n in range(MAX_OPEN_ALERTS + 2):
        await fanout.publish(alert_event("cam", f"a{n}", "start"))
    await fanout.publish(alert_event("cam", "a5", "end"))
    await fanout.publish(alert_event("other", "b0", "start"))
    opened = [e.body.alert_id for e in fanout.open_alerts("cam")]  # type: ignore[union-attr]
    # The two oldest were forgotten to keep the bound; an ended one leaves; other streams keep theirs.
    assert opened == [f"a{n}" for n in range(2, MAX_OPEN_ALERTS + 2) if n != 5]
    assert fanout.open_alerts_forgotten == 2
    assert [e.body.alert_id for e in fanout.open_alerts("other")] == ["b0"]  # type: ignore[union-attr]
    fanout.close_stream("cam")
    assert fanout.open_alerts("cam") == []
