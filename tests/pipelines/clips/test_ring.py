"""The pre-event ring: whole GOPs from a keyframe, bounded by seconds and bytes, spans that never
mix two connections, and every drop counted."""

from __future__ import annotations

from fractions import Fraction

from engines.media.remux import CodecHeader, EncodedPacket
from pipelines.clips.ring import PacketRing

TB = Fraction(1, 90_000)


def header() -> CodecHeader:
    return CodecHeader(b"", "h264", 64, 48)


def feed(ring: PacketRing, codec: CodecHeader, start_t: float, seconds: float, *, fps: int = 10, gop: int = 10,
         size: int = 100) -> None:
    """`seconds` of video at `fps`, a keyframe every `gop` frames, the first at `start_t`."""
    for i in range(round(seconds * fps)):
        t = start_t + i / fps
        pts = round(i / fps / TB)
        ring.append(t, EncodedPacket(bytes(size), pts, pts, round(1 / fps / TB), i % gop == 0, TB, codec))


def test_the_ring_keeps_whole_gops_from_a_keyframe_within_its_seconds() -> None:
    ring = PacketRing(max_s=5.0, max_bytes=10**9)
    feed(ring, header(), 0.0, 20.0)
    assert ring.oldest_t is not None and ring.newest_t is not None
    # Kept: at least 5 s back from the newest packet, at most one GOP (1 s) more.
    assert 5.0 <= ring.newest_t - ring.oldest_t < 6.0
    kept = ring.span(0.0, 100.0)
    assert kept[0].packet.keyframe and kept[0].t == ring.oldest_t
    assert ring.stats.packets == 200 and ring.stats.gops_dropped == 14
    assert ring.stats.bytes_dropped == 14 * 10 * 100 and ring.bytes == len(kept) * 100


def test_the_byte_bound_drops_old_gops_but_never_the_one_being_written() -> None:
    ring = PacketRing(max_s=60.0, max_bytes=2_500)
    feed(ring, header(), 0.0, 10.0)
    assert ring.bytes <= 2_500 and ring.span(0.0, 100.0)[0].packet.keyframe
    tiny = PacketRing(max_s=60.0, max_bytes=10)
    feed(tiny, header(), 0.0, 0.5)  # one GOP larger than the bound: still the only start there is
    assert len(tiny.span(0.0, 1.0)) == 5 and tiny.stats.gops_dropped == 0


def test_a_span_starts_at_the_keyframe_before_its_start_and_ends_at_its_end() -> None:
    ring = PacketRing(max_s=60.0, max_bytes=10**9)
    feed(ring, header(), 100.0, 10.0)
    span = ring.span(103.55, 105.25)
    assert span[0].t == 103.0 and span[0].packet.keyframe
    assert span[-1].t == 105.2
    assert ring.span(50.0, 60.0) == []  # nothing kept is that old
    assert ring.span(10.0, 101.0)[0].t == 100.0  # older than the ring: from the first keyframe kept


def test_packets_of_a_new_connection_wait_for_its_keyframe_and_spans_never_mix_connections() -> None:
    ring = PacketRing(max_s=60.0, max_bytes=10**9)
    first, second = header(), header()
    feed(ring, first, 0.0, 3.0)
    ring.append(3.05, EncodedPacket(bytes(100), 0, 0, 9000, False, TB, second))  # joined mid-GOP
    assert ring.stats.before_keyframe == 1
    feed(ring, second, 4.0, 3.0)
    across = ring.span(1.0, 5.0)
    assert {item.packet.header for item in across} == {second}  # cut from the connection holding the end
    assert across[0].t == 4.0
    assert {item.packet.header for item in ring.span(0.5, 2.5)} == {first}
