"""A stream's last seconds of encoded video, whole GOPs only, bounded by time and by bytes.

A clip can only start at a keyframe, so the ring drops from its front one GOP at a time (a
keyframe and the packets up to the next one) and always begins at a keyframe. Packets are placed
on the stream's timeline (`t`, seconds that never run backwards: see pipelines.clock), so spans
survive the pts restart of a reconnect. Each connection has its own codec header; a span never
mixes two, and is cut from the connection that holds its end.

What is dropped is counted: whole GOPs aged out or pushed out by the byte bound, and packets that
arrived before the first keyframe of a connection (they could start no clip).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from engines.media.remux import EncodedPacket


@dataclass(slots=True)
class RingStats:
    packets: int = 0  # taken in
    gops_dropped: int = 0  # aged out or pushed out by the byte bound
    bytes_dropped: int = 0
    before_keyframe: int = 0  # packets of a connection before its first keyframe (never kept)


@dataclass(frozen=True, slots=True)
class Timed:
    t: float  # the packet's time on the stream's timeline (its pts there)
    packet: EncodedPacket


@dataclass
class PacketRing:
    max_s: float  # the span kept: newest packet's time minus the time of the GOP that starts it
    max_bytes: int
    stats: RingStats = field(default_factory=RingStats)
    _gops: deque[list[Timed]] = field(default_factory=deque, repr=False)
    _bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def put(self, t: float, packet: EncodedPacket) -> None:
        """`append` from any thread (a source's reader thread puts, the stage cuts spans)."""
        with self._lock:
            self.append(t, packet)

    def cut(self, start: float, end: float) -> list[Timed]:
        """`span` from any thread."""
        with self._lock:
            return self.span(start, end)

    def append(self, t: float, packet: EncodedPacket) -> None:
        self.stats.packets += 1
        last = self._gops[-1] if self._gops else None
        if packet.keyframe:
            self._gops.append([Timed(t, packet)])
        elif last is None or last[-1].packet.header is not packet.header:
            self.stats.before_keyframe += 1  # a new connection's packets wait for its keyframe
            return
        else:
            last.append(Timed(t, packet))
        self._bytes += packet.size
        self._trim(t)

    def _trim(self, newest: float) -> None:
        # The newest GOP is never dropped: while it grows it is the only start a clip has.
        while len(self._gops) > 1 and (newest - self._gops[1][0].t >= self.max_s or self._bytes > self.max_bytes):
            gop = self._gops.popleft()
            size = sum(item.packet.size for item in gop)
            self._bytes -= size
            self.stats.gops_dropped += 1
            self.stats.bytes_dropped += size

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def oldest_t(self) -> float | None:
        return self._gops[0][0].t if self._gops else None

    @property
    def newest_t(self) -> float | None:
        return self._gops[-1][-1].t if self._gops else None

    def span(self, start: float, end: float) -> list[Timed]:
        """The packets from the last keyframe at or before `start` (or the first one kept, if
        `start` is older) through the last packet at or before `end`, all of the connection that
        holds `end`. Packets are in decode order and the cut keeps every packet before the last
        one at or before `end`, so each packet kept has the packets it refers to. Empty when
        nothing kept is at or before `end`."""
        kept = [gop for gop in self._gops if gop[0].t <= end]
        if not kept:
            return []
        header = kept[-1][0].packet.header
        run: list[list[Timed]] = []  # the trailing GOPs of the connection that holds `end`
        for gop in reversed(kept):
            if gop[0].packet.header is not header:
                break
            run.append(gop)
        run.reverse()
        first = max((i for i, gop in enumerate(run) if gop[0].t <= start), default=0)
        items = [item for gop in run[first:] for item in gop]
        last = max(i for i, item in enumerate(items) if item.t <= end)
        return items[: last + 1]
