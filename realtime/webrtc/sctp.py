"""What a browser may send over its DataChannels: small messages, reassembled in linear time.

The page only listens on its channel (it sends nothing but the channel's open request), yet
aiortc's SCTP transport reassembles messages of any size, and it rescans every fragment it
holds for each fragment that arrives: a 10 MB message cost 32.6 s of CPU and a 20 MB one ran
for minutes at a full core. The bound must act where fragments are taken in, before that scan,
not on `on("message")`, which only sees a message once it has been reassembled.

`bound_sctp` turns one session's `RTCSctpTransport` into a `BoundedSctpTransport` (the peer
connection creates the transport while reading the offer; other peer connections in the
process are untouched):

- the answer advertises `a=max-message-size:MAX_MESSAGE_BYTES` (browsers refuse to send more);
- a peer that sends a larger message anyway, or holds more than `MAX_HELD_BYTES` or
  `MAX_HELD_FRAGMENTS` unassembled (a huge message, or a flood of fragments that never
  complete), is refused: its data is dropped from then on and `on_refused` ends the session;
- a stream's fragments are only scanned for complete messages once one of them is a last
  fragment (nothing can complete before), so the cost per fragment is constant while a message
  is arriving, and bounded by `MAX_HELD_FRAGMENTS` at worst.

Once the connection under it is gone (ICE consent lost: the browser's machine stopped answering),
aiortc's own background tasks (`_transmit`, `_data_channel_flush`, its retransmission timers)
still try to send, and each raised `ConnectionError` into a task nobody awaits: asyncio logged
"Task exception was never retrieved" as an error, with a traceback, for a session that was
ending anyway (bench/soak.py, peers on an overloaded machine). A chunk sent with no connection
under it is dropped instead, as the network would drop it, and counted (`sent_unconnected`).

This reaches into aiortc's private reassembly (`InboundStream`, `_get_inbound_stream`,
`_receive_data_chunk`, `_receive`), pinned by tests that send oversized and fragmented
messages from a real aiortc peer: an aiortc upgrade that changes them fails those tests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from aiortc.rtcsctptransport import (
    SCTP_DATA_LAST_FRAG,
    Chunk,
    DataChunk,
    InboundStream,
    RTCSctpCapabilities,
    RTCSctpTransport,
)

log = logging.getLogger(__name__)

# What the page sends is its channel's open request (a few dozen bytes); 16 KiB is the message size
# long advised as the one every browser handles (RFC 8831 section 6.6).
MAX_MESSAGE_BYTES = 16 * 1024
# Unassembled data a peer may hold: a few messages' worth while a lost fragment is retransmitted.
MAX_HELD_BYTES = 4 * MAX_MESSAGE_BYTES
# Fragments held: each costs a Python object beyond its bytes, and bounds the rescan of a stream.
MAX_HELD_FRAGMENTS = 256


@dataclass(slots=True)
class _Held:
    """What one association holds unassembled, over all its streams."""

    fragments: int = 0
    bytes: int = 0


class BoundedInboundStream(InboundStream):
    """aiortc's reassembly of one stream, accounted into the association's `_Held`, and only
    rescanned when a message may have completed."""

    def __init__(self, held: _Held) -> None:
        super().__init__()
        self._held = held
        self._last_fragments = 0  # fragments held that end a message

    def add_chunk(self, chunk: DataChunk) -> None:
        before = len(self.reassembly)
        super().add_chunk(chunk)
        if len(self.reassembly) > before:
            self._held.fragments += 1
            self._held.bytes += len(chunk.user_data)
            if chunk.flags & SCTP_DATA_LAST_FRAG:
                self._last_fragments += 1

    def pop_messages(self) -> Iterator[tuple[int, int, bytes]]:
        if not self._last_fragments:
            return  # no message can be complete without its last fragment: skip the scan
        held = len(self.reassembly)
        for message in super().pop_messages():
            # aiortc took the message's fragments out of `reassembly` before handing it over.
            self._held.fragments -= held - len(self.reassembly)
            self._held.bytes -= len(message[2])
            self._last_fragments -= 1
            held = len(self.reassembly)
            yield message

    def prune_chunks(self, tsn: int) -> int:
        before = self.reassembly
        size = super().prune_chunks(tsn)
        removed = len(before) - len(self.reassembly)  # aiortc drops a prefix
        self._held.fragments -= removed
        self._held.bytes -= size
        self._last_fragments -= sum(1 for chunk in before[:removed] if chunk.flags & SCTP_DATA_LAST_FRAG)
        return size


class BoundedSctpTransport(RTCSctpTransport):
    """An `RTCSctpTransport` that refuses oversized messages (see the module docstring).
    Made by `bound_sctp` from the transport aiortc created; never constructed directly."""

    _held: _Held
    _on_refused: Callable[[str], None]
    refused: str | None
    sent_unconnected: int  # chunks dropped because the connection under them was gone

    def getCapabilities(self) -> RTCSctpCapabilities:  # type: ignore[override]  # a classmethod upstream
        return RTCSctpCapabilities(maxMessageSize=MAX_MESSAGE_BYTES)

    def _get_inbound_stream(self, stream_id: int) -> InboundStream:
        stream = self._inbound_streams.get(stream_id)
        if stream is None:
            stream = self._inbound_streams[stream_id] = BoundedInboundStream(self._held)
        return stream

    async def _receive_data_chunk(self, chunk: DataChunk) -> None:
        if self.refused is not None:
            return  # the session is ending: take nothing more in
        held = self._held
        if held.bytes + len(chunk.user_data) > MAX_HELD_BYTES or held.fragments >= MAX_HELD_FRAGMENTS:
            self._refuse(
                f"data channel: the page sent more than {MAX_HELD_BYTES} bytes or {MAX_HELD_FRAGMENTS} fragments "
                f"that do not make a message (messages are limited to {MAX_MESSAGE_BYTES} bytes)"
            )
            return
        await super()._receive_data_chunk(chunk)

    async def _receive(self, stream_id: int, pp_id: int, data: bytes) -> None:
        if self.refused is not None:
            return
        if len(data) > MAX_MESSAGE_BYTES:
            self._refuse(f"data channel: the page sent a {len(data)}-byte message (the limit is {MAX_MESSAGE_BYTES})")
            return
        await super()._receive(stream_id, pp_id, data)

    async def _send_chunk(self, chunk: Chunk) -> None:
        try:
            await super()._send_chunk(chunk)
        except ConnectionError:
            self.sent_unconnected += 1  # the session ends on its own (the connection state says so)

    def _refuse(self, reason: str) -> None:
        self.refused = reason
        for stream in self._inbound_streams.values():
            stream.reassembly = []  # what it held is never delivered: free it now
            if isinstance(stream, BoundedInboundStream):
                stream._last_fragments = 0
        self._held.fragments = self._held.bytes = 0
        log.warning("webrtc data channel refused", extra={"reason": reason})
        self._on_refused(reason)


def bound_sctp(transport: RTCSctpTransport, on_refused: Callable[[str], None]) -> BoundedSctpTransport:
    """Bound one session's SCTP transport (before the answer is made, so that it advertises the
    limit, and before any data arrives). `on_refused(reason)` is called once, from the event loop."""
    if transport._inbound_streams:
        raise RuntimeError("bound_sctp: the transport has already received data")
    transport.__class__ = BoundedSctpTransport
    assert isinstance(transport, BoundedSctpTransport)
    transport._held = _Held()
    transport._on_refused = on_refused
    transport.refused = None
    transport.sent_unconnected = 0
    return transport
