"""Live viewers' queues: a viewer starts at a keyframe, one that falls behind skips to the next
keyframe and is dropped when it keeps falling behind, each counted, and none of it touches the
other viewers of the same feed. Real H.264 packets (libx264, as a file source hands them)."""

from __future__ import annotations

import asyncio

import av

from engines.media.remux import EncodedPacket
from realtime.webrtc.live import RTP_CLOCK, LiveFeed, PacketTrack
from tests.engines.media.test_h264 import mp4_packets


def track(max_packets: int = 8, max_skips: int = 2) -> tuple[PacketTrack, list[int]]:
    behind: list[int] = []
    return PacketTrack(max_packets=max_packets, max_skips=max_skips, on_behind=lambda: behind.append(1)), behind


def stream_of(packets: list[EncodedPacket], repeat: int) -> list[tuple[float, EncodedPacket]]:
    return [(n * 0.1, packets[n % len(packets)]) for n in range(len(packets) * repeat)]


async def test_a_viewer_starts_at_a_keyframe_and_gets_every_packet_while_it_keeps_up() -> None:
    packets = mp4_packets(count=12, gop=4)
    viewer, behind = track(max_packets=16)
    offered = stream_of(packets, 1)[2:]  # joins mid-GOP
    for t, packet in offered:
        viewer.offer(t, packet)
    for t, _ in offered[2:]:  # from the next keyframe on
        sent = await asyncio.wait_for(viewer.recv(), 2)
        assert isinstance(sent, av.Packet) and sent.pts == round(t * RTP_CLOCK)
    assert viewer.stats.before_keyframe == 2 and viewer.stats.packets == 8 and viewer.stats.skips == 0
    assert not behind


async def test_a_viewer_that_stops_reading_skips_then_is_dropped_and_the_others_never_notice() -> None:
    packets = mp4_packets(count=12, gop=4)
    loop = asyncio.get_running_loop()
    feed = LiveFeed("cam", loop)
    stuck, behind = track(max_packets=8, max_skips=2)
    reader, reader_behind = track(max_packets=8, max_skips=2)
    feed.viewers |= {stuck, reader}
    got = 0
    for t, packet in stream_of(packets, 3):
        feed.put(t, packet)  # as the reader thread does: the copy is scheduled on the loop
        await asyncio.sleep(0)
        await asyncio.wait_for(reader.recv(), 2)
        got += 1
    assert got == 36 and reader.stats.skips == 0 and not reader_behind
    assert stuck.stats.skips == 2 and len(behind) == 1  # dropped on its second fall behind
    assert len(stuck._queue) <= 8  # never more than its bound


async def test_a_stopped_track_ends_its_sender() -> None:
    viewer, _ = track()
    waiting = asyncio.create_task(viewer.recv())
    await asyncio.sleep(0)
    viewer.stop()
    try:
        await waiting
    except Exception as exc:
        assert type(exc).__name__ == "MediaStreamError"
    else:
        raise AssertionError("recv() returned after stop()")
