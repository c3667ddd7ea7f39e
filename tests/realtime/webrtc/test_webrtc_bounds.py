"""What a hostile or broken peer can make a browser session cost, against the real service with
real aiortc peers: DataChannel messages are bounded before reassembly, offers are counted before
aiortc reads them, remote candidates never point the service's STUN checks at loopback or
metadata addresses, checks are rate-limited, and offers that never connect cannot lock others out."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import aiortc.sdp
import numpy as np
import pytest
from aioice.ice import get_host_addresses
from aiortc import RTCPeerConnection

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.webrtc.sctp import MAX_MESSAGE_BYTES
from tests.support.peer import connect, load_frames, make_offer
from tests.support.service import LiveService, live_service, make_config
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def frames(vtest_avi: Path) -> list[np.ndarray]:
    return load_frames(vtest_avi, count=5)


@pytest.fixture
async def svc(detector: Detector, shared_nats_server: EmbeddedNatsServer) -> AsyncIterator[LiveService]:
    config = make_config(webrtc={"max_sessions": 4, "connect_timeout_s": 20})
    async with live_service(detector, shared_nats_server.url, config=config) as live:
        yield live


async def post_offer(svc: LiveService, sdp: str, http: aiohttp.ClientSession | None = None) -> tuple[int, Any]:
    session = http or svc.session
    async with session.post(f"{svc.url}/api/webrtc/offer", json={"sdp": sdp, "type": "offer"}) as response:
        return response.status, await response.json()


async def offer_sdp(frames: list[np.ndarray]) -> tuple[RTCPeerConnection, str]:
    pc, _, _ = await make_offer(frames=frames, speech=None)
    return pc, pc.localDescription.sdp


def candidate(index: int, address: str, port: int) -> str:
    return f"a=candidate:x{index} 1 udp {2130706431 - index} {address} {port} typ host"


class UdpCounter(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: list[tuple[float, bytes]] = []

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.received.append((time.monotonic(), data))


async def udp_listeners(host: str, count: int) -> tuple[list[asyncio.DatagramTransport], UdpCounter]:
    loop = asyncio.get_running_loop()
    counter = UdpCounter()
    transports = []
    for _ in range(count):
        transport, _ = await loop.create_datagram_endpoint(lambda: counter, local_addr=(host, 0))
        transports.append(transport)
    return transports, counter


# -- High 3: DataChannel messages ------------------------------------------------------------------


async def test_an_oversized_channel_message_ends_the_session_before_it_is_reassembled(
    svc: LiveService, frames: list[np.ndarray]
) -> None:
    peer = await connect(svc.session, svc.url, frames=frames)
    try:
        await svc.wait_for_state(peer.stream_id, "live")
        await wait_until(lambda: peer.channel.readyState == "open", 10, "the channel to open")
        peer.channel.send(b"x" * 1000)  # small messages are fine
        assert peer.pc.sctp is not None
        peer.pc.sctp._remote_max_message_size = 0  # a hostile peer ignores the advertised limit
        started = time.process_time()
        peer.channel.send(b"x" * (4 << 20))
        await wait_until(lambda: peer.stream_id not in svc.service.sessions, 15, "the session to end")
        # Both peers live in this process: its CPU time bounds the server's. Before the bound this
        # message alone cost the server minutes of CPU (quadratic reassembly) and never ended the session.
        assert time.process_time() - started < 10
        reasons = list(svc.service.sessions.ended)
        assert any(r.startswith("data channel:") for r in reasons), reasons
        assert svc.service.sessions.refusals["channel"] == 1
        metrics = (await svc.call("GET", "/metrics")).body
        assert 'vidsentry_webrtc_peer_refusals_total{what="channel"} 1.0' in metrics
        assert f"a=max-message-size:{MAX_MESSAGE_BYTES}" in peer.answer["sdp"]  # browsers keep to it
    finally:
        await peer.close()


# -- Medium 6: candidates and checks -------------------------------------------------------------


async def test_too_many_candidates_are_refused_before_aiortc_reads_them(
    svc: LiveService, frames: list[np.ndarray]
) -> None:
    pc, sdp = await offer_sdp(frames)
    try:
        many = [candidate(i, "192.0.2.200", 10000 + i) for i in range(65)]
        status, body = await post_offer(svc, _first_section(sdp, many))
        assert status == 400, body
        assert " ICE candidates, more than webrtc.max_ice_candidates (64)" in body["error"], body
        assert svc.service.sessions.count == 0 and svc.service.sessions.connecting == 0
    finally:
        await pc.close()


def _first_section(sdp: str, candidates: list[str]) -> str:
    """The candidates in the first m-section only (a BUNDLE offer's transport)."""
    out, done = [], False
    for line in sdp.splitlines():
        out.append(line)
        if line.startswith("a=ice-pwd:") and not done:
            out += candidates
            done = True
    return "\r\n".join(out) + "\r\n"


async def test_candidates_on_loopback_link_local_and_metadata_addresses_get_no_checks(
    svc: LiveService, frames: list[np.ndarray]
) -> None:
    transports, counter = await udp_listeners("127.0.0.1", 2)
    host = next(a for a in get_host_addresses(use_ipv4=True, use_ipv6=False))
    allowed, control = await udp_listeners(host, 1)  # shows when the checks have started
    pc, sdp = await offer_sdp(frames)
    try:
        ports = [t.get_extra_info("sockname")[1] for t in transports]
        hostile = [
            candidate(1, "127.0.0.1", ports[0]),
            candidate(2, "::ffff:127.0.0.1", ports[1]),
            candidate(3, "169.254.169.254", 80),
            candidate(4, "fd00:ec2::254", 80),
            candidate(5, "224.0.0.251", 5353),
            candidate(6, "0.0.0.0", 9),
            candidate(7, "fe80::1", 9),
        ]
        fine = candidate(8, host, allowed[0].get_extra_info("sockname")[1])
        status, body = await post_offer(svc, _first_section(sdp, [*hostile, fine]))
        assert status == 201, body
        session = svc.service.sessions.source(body["stream_id"])
        ice = [t.receiver.transport.transport for t in session.pc.getTransceivers()]
        remote = {c.ip for transport in ice for c in transport.getRemoteCandidates()}
        assert not remote & {"127.0.0.1", "::ffff:127.0.0.1", "169.254.169.254", "fd00:ec2::254", "224.0.0.251",
                             "0.0.0.0", "fe80::1"}, remote
        assert svc.service.sessions.refusals["candidates"] == 7
        # Checks start as soon as the answer is out: once the allowed candidate has had one, none went to loopback.
        await wait_until(lambda: bool(control.received), 10, "a check sent to the allowed candidate")
        assert counter.received == [], "the service sent STUN to a loopback candidate"
    finally:
        await pc.close()
        for transport in [*transports, *allowed]:
            transport.close()


async def test_connectivity_checks_are_rate_limited_per_session(svc: LiveService, frames: list[np.ndarray]) -> None:
    host = next(a for a in get_host_addresses(use_ipv4=True, use_ipv6=False))
    transports, counter = await udp_listeners(host, 60)
    pc, sdp = await offer_sdp(frames)
    try:
        targets = [candidate(i, host, t.get_extra_info("sockname")[1]) for i, t in enumerate(transports)]
        status, body = await post_offer(svc, _first_section(sdp, targets))
        assert status == 201, body
        budget = svc.service.sessions._stun[body["stream_id"]]
        assert (budget.burst, budget.rate) == (20, 10.0)  # ice.STUN_BURST, STUN_RATE
        # 20 at once, then 10 a second: 35 take 1.5 s. aioice alone starts a check every 20 ms and
        # retransmits each one, well over a hundred requests in 3 s. Timed from the bucket's own
        # start (checks begin at setLocalDescription, before the answer is out).
        await wait_until(lambda: len(counter.received) >= 35, 15, "35 connectivity checks")
        elapsed = time.monotonic() - budget.created_at
        assert budget.sent <= budget.burst + budget.rate * elapsed, (budget.sent, elapsed)
        assert len(counter.received) <= budget.sent, (len(counter.received), budget.sent)
    finally:
        await pc.close()
        for transport in transports:
            transport.close()


# -- Low: offers counted first, said in words ----------------------------------------------------------


async def test_an_offer_with_hundreds_of_m_sections_is_refused_by_count(
    svc: LiveService, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdp = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n" + "m=video 9 UDP/TLS/RTP/SAVPF 96\r\n" * 650
    # Refused before aiortc's parser, whose cost grows with the sections, ever sees it.
    parsed: list[str] = []
    parse = aiortc.sdp.SessionDescription.parse

    def spy(text: str) -> aiortc.sdp.SessionDescription:
        parsed.append(text)
        return parse(text)

    monkeypatch.setattr(aiortc.sdp.SessionDescription, "parse", staticmethod(spy))
    status, body = await post_offer(svc, sdp)
    assert status == 400 and "650 m-sections, more than 8" in body["error"], body
    assert parsed == []


async def test_a_truncated_bundle_offer_is_told_what_is_wrong(svc: LiveService, frames: list[np.ndarray]) -> None:
    pc, sdp = await offer_sdp(frames)
    await pc.close()
    truncated = sdp[: sdp.index("m=application")]  # the BUNDLE group still names the data channel's mid
    status, body = await post_offer(svc, truncated)
    assert status == 400, body
    assert "the BUNDLE group names mid '1', which no m-section has" in body["error"], body
    mid_line = sdp.index("a=setup:") + len("a=setup:act")
    status, body = await post_offer(svc, sdp[:mid_line])
    assert status == 400 and "is not one of" in body["error"] and "truncated" in body["error"], body
    assert svc.service.sessions.count == 0


# -- Low: offers that never connect --------------------------------------------------------------


async def test_offers_that_never_connect_do_not_lock_out_other_clients(
    svc: LiveService, frames: list[np.ndarray]
) -> None:
    stalled: list[RTCPeerConnection] = []
    others: list[aiohttp.ClientSession] = []
    peer = None
    try:
        # One client's offers that never complete ICE (the answer is never applied): one connecting at a time.
        pc, sdp = await offer_sdp(frames)
        stalled.append(pc)
        status, body = await post_offer(svc, sdp)
        assert status == 201, body
        pc, sdp = await offer_sdp(frames)
        stalled.append(pc)
        status, body = await post_offer(svc, sdp)
        assert status == 503 and "webrtc.max_connecting_per_client" in body["error"], body
        assert body["detail"] == {"limit": 1, "setting": "webrtc.max_connecting_per_client"}
        # A second client stalls too: the service-wide connecting budget (2) is full now.
        second = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0)))
        others.append(second)
        pc, sdp = await offer_sdp(frames)
        stalled.append(pc)
        status, body = await post_offer(svc, sdp, second)
        assert status == 201, body
        third = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.3", 0)))
        others.append(third)
        pc, sdp = await offer_sdp(frames)
        stalled.append(pc)
        status, body = await post_offer(svc, sdp, third)
        assert status == 503 and "webrtc.max_connecting" in body["error"], body
        assert svc.service.sessions.connecting == 2 and svc.service.sessions.rejected_connecting == 2
        # ... but sessions that connect leave the budget: once one stalled session ends, a real
        # browser gets in and connects, and the budget frees again.
        stalled_id = next(iter(svc.service.sessions._clients))
        svc.service.sessions.source(stalled_id).close("test")
        peer = await connect(third, svc.url, frames=frames)
        await svc.wait_for_state(peer.stream_id, "live")
        assert svc.service.sessions.connecting == 1
        metrics = (await svc.call("GET", "/metrics")).body
        assert "vidsentry_webrtc_sessions_rejected_connecting_total 2.0" in metrics
    finally:
        if peer is not None:
            await peer.close()
        for pc in stalled:
            await pc.close()
        for session in others:
            await session.close()


def test_loopback_aliases_exist() -> None:
    # The admission test speaks from 127.0.0.2 and .3 (the whole 127/8 is loopback on Linux).
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", 0))
