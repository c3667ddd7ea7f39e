"""The bounded SCTP reassembly of a session, fed aiortc DATA chunks directly: the held fragments
are accounted, and a message still arriving costs no rescan; and what is sent once the connection
is gone is dropped, not raised into aiortc's unawaited tasks."""

from __future__ import annotations

import gc
import time

from aiortc import RTCCertificate, RTCDtlsTransport, RTCIceGatherer, RTCIceTransport, RTCSctpTransport
from aiortc.rtcsctptransport import SCTP_DATA_FIRST_FRAG, SCTP_DATA_LAST_FRAG, DataChunk, InboundStream

from realtime.webrtc.sctp import BoundedInboundStream, _Held, bound_sctp


def chunk(tsn: int, flags: int = 0, size: int = 1000, seq: int = 0) -> DataChunk:
    data = DataChunk(flags=flags)
    data.tsn, data.stream_id, data.stream_seq, data.protocol = tsn, 0, seq, 53
    data.user_data = b"x" * size
    return data


def feed(stream: InboundStream, fragments: int) -> tuple[float, list[tuple[int, int, bytes]]]:
    """One message of `fragments` fragments, popping after each as aiortc does; the CPU seconds this
    thread took (not the process's: threads other tests left behind would be counted too), with the
    garbage collector paused (late in a full run a collection walks every other test's objects)."""
    messages = []
    gc.collect()
    gc.disable()
    try:
        started = time.thread_time()
        for index in range(fragments):
            first, last = index == 0, index == fragments - 1
            flags = (SCTP_DATA_FIRST_FRAG if first else 0) | (SCTP_DATA_LAST_FRAG if last else 0)
            stream.add_chunk(chunk(index + 1, flags))
            messages += list(stream.pop_messages())
        return time.thread_time() - started, messages
    finally:
        gc.enable()


def test_a_message_arriving_costs_constant_time_per_fragment() -> None:
    held = _Held()
    seconds, messages = feed(BoundedInboundStream(held), 4000)
    assert [len(m[2]) for m in messages] == [4_000_000]
    assert (held.fragments, held.bytes) == (0, 0)
    # aiortc's own reassembly rescans every held fragment for each new one: quadratic.
    upstream, _ = feed(InboundStream(), 4000)
    assert seconds < upstream / 10, (seconds, upstream)


def test_held_fragments_are_accounted_through_delivery_and_pruning() -> None:
    held = _Held()
    stream = BoundedInboundStream(held)
    stream.add_chunk(chunk(1, SCTP_DATA_FIRST_FRAG, 100))
    stream.add_chunk(chunk(3, SCTP_DATA_FIRST_FRAG | SCTP_DATA_LAST_FRAG, 50, seq=1))  # waits for seq 0
    assert list(stream.pop_messages()) == []
    assert (held.fragments, held.bytes) == (2, 150)
    stream.add_chunk(chunk(2, SCTP_DATA_LAST_FRAG, 100))
    assert [len(m[2]) for m in stream.pop_messages()] == [200, 50]
    assert (held.fragments, held.bytes) == (0, 0)
    stream.add_chunk(chunk(4, SCTP_DATA_FIRST_FRAG, 10, seq=2))
    stream.add_chunk(chunk(6, SCTP_DATA_LAST_FRAG, 10, seq=2))
    assert stream.prune_chunks(6) == 20  # a FORWARD TSN abandons the message
    assert (held.fragments, held.bytes) == (0, 0)


async def test_a_chunk_sent_once_the_connection_is_gone_is_dropped_and_counted() -> None:
    """aiortc's background tasks keep sending after ICE consent is lost; each raised into a task no
    one awaits ("Task exception was never retrieved", logged as an error). A real transport over a
    DTLS transport that is not connected is that state."""
    ice = RTCIceTransport(RTCIceGatherer())
    dtls = RTCDtlsTransport(ice, [RTCCertificate.generateCertificate()])
    transport = bound_sctp(RTCSctpTransport(dtls), lambda reason: None)
    transport._remote_port = 5000  # what start() sets from the offer, before any chunk is sent

    await transport._send_chunk(chunk(1, SCTP_DATA_FIRST_FRAG | SCTP_DATA_LAST_FRAG))

    assert transport.sent_unconnected == 1
