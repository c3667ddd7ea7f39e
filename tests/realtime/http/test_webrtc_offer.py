"""What a client can send to the WebRTC signalling routes: every bad offer is a 4xx with a reason,
and none leaves a peer connection, a session or a stream behind."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.peer import connect, load_frames, make_offer
from tests.support.service import LiveService, live_service, make_config

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def frames(vtest_avi: Path) -> list[np.ndarray]:
    return load_frames(vtest_avi, count=5)


@pytest.fixture
async def offer_sdp(frames: list[np.ndarray]) -> str:
    pc, _, _ = await make_offer(frames=frames, speech=None)
    sdp: str = pc.localDescription.sdp
    await pc.close()
    return sdp


def assert_refused(reply: object, status: int, *fragments: str) -> None:
    assert reply.status == status, reply
    body = reply.body
    assert isinstance(body, dict) and body["error"], reply
    text = json.dumps(body)
    for fragment in fragments:
        assert fragment in text, (fragment, body)


async def assert_nothing_opened(svc: LiveService) -> None:
    assert svc.service.sessions.count == 0
    assert (await svc.call("GET", "/api/streams")).body["streams"] == []


GARBAGE = [
    ({"sdp": "hello", "type": "offer"}, "must start with v=0"),
    ({"sdp": "v=0\r\n", "type": "offer"}, "no audio or video"),
    ({"sdp": "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n", "type": "offer"}, "invalid offer: sdp: cannot be used"),
    ({"sdp": "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n" + "a=x\r\n" * 9000, "type": "offer"}, "webrtc.max_sdp_bytes"),
    ({"sdp": 42, "type": "offer"}, "sdp: must be the offer's SDP text"),
    ({"type": "offer"}, "sdp: must be the offer's SDP text"),
    ({"sdp": "v=0", "type": "answer"}, "must be \\\"offer\\\""),
    ({"sdp": "v=0", "type": "offer", "extra": 1}, "extra: unknown field"),
    ({"sdp": "v=0", "type": "offer", "stream_id": "../etc"}, "stream_id: use 1-64 characters"),
]


@pytest.mark.parametrize(("body", "reason"), GARBAGE, ids=[r for _, r in GARBAGE])
async def test_bad_offers_are_400_with_a_reason(svc: LiveService, body: dict[str, object], reason: str) -> None:
    assert_refused(await svc.call("POST", "/api/webrtc/offer", json_body=body), 400, reason)
    await assert_nothing_opened(svc)


async def test_bodies_that_are_not_an_offer(svc: LiveService, offer_sdp: str) -> None:
    assert_refused(await svc.call("POST", "/api/webrtc/offer", data=b""), 400, "missing body", "offer object")
    assert_refused(await svc.call("POST", "/api/webrtc/offer", data=b"[1, 2]"), 400, "expected one offer object")
    assert_refused(await svc.call("POST", "/api/webrtc/offer", data=b"{nope"), 400, "bad JSON")
    form = json.dumps({"sdp": offer_sdp, "type": "offer"})
    assert_refused(await svc.call("POST", "/api/webrtc/offer", data=form, content_type="text/plain"), 415, "json")
    huge = json.dumps({"sdp": "v=0" + "x" * (1 << 20), "type": "offer"})
    assert_refused(await svc.call("POST", "/api/webrtc/offer", data=huge), 413, "max_bytes")
    await assert_nothing_opened(svc)


async def test_a_receive_only_offer_is_refused(svc: LiveService) -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    try:
        reply = await svc.call("POST", "/api/webrtc/offer", json_body={"sdp": pc.localDescription.sdp, "type": "offer"})
        assert_refused(reply, 400, "no audio or video track")
    finally:
        await pc.close()
    await assert_nothing_opened(svc)


async def test_webrtc_streams_cannot_be_added_as_streams(svc: LiveService) -> None:
    reply = await svc.call("POST", "/api/streams", json_body={"id": "b1", "kind": "webrtc"})
    assert_refused(reply, 400, "POST /api/webrtc/offer")


async def test_beacon_bodies(svc: LiveService) -> None:
    for data in (b"", b"nope", b'{"stream_id": 1, "close_token": "x"}', b'{"stream_id": "a"}'):
        reply = await svc.call("POST", "/api/webrtc/close", data=data, content_type="text/plain")
        assert_refused(reply, 400, "bad close request")
    for body in (b'{"stream_id": "nobody", "close_token": "x"}', b'{"stream_id": "a", "close_token": "\\ud800"}'):
        reply = await svc.call("POST", "/api/webrtc/close", data=body, content_type="text/plain")
        assert_refused(reply, 403, "no session with this stream id and close token")


@pytest.fixture
async def token_svc(detector: Detector, shared_nats_server: EmbeddedNatsServer) -> AsyncIterator[LiveService]:
    async with live_service(detector, shared_nats_server.url, config=make_config(), token=TOKEN) as live:
        yield live


async def test_offers_need_the_token_and_the_beacon_its_close_token(
    token_svc: LiveService, frames: list[np.ndarray], offer_sdp: str
) -> None:
    body = {"sdp": offer_sdp, "type": "offer"}
    assert_refused(await token_svc.call("POST", "/api/webrtc/offer", json_body=body, token=None), 401, "Bearer")
    assert_refused(await token_svc.call("POST", "/api/webrtc/offer", json_body=body, token="wrong"), 401, "not valid")
    await assert_nothing_opened(token_svc)
    peer = await connect(token_svc.session, token_svc.url, frames=frames, token=TOKEN)
    try:
        # The beacon carries no bearer token (sendBeacon cannot set headers): the close token is enough.
        close = json.dumps({"stream_id": peer.stream_id, "close_token": peer.answer["close_token"]})
        reply = await token_svc.call("POST", "/api/webrtc/close", data=close, content_type="text/plain", token=None)
        assert reply.status == 204, reply
        assert peer.stream_id not in token_svc.service.sessions
    finally:
        await peer.close()


async def test_the_page_learns_the_configured_ice_servers_behind_the_token(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    turn = {"urls": ["turn:turn.example:3478"], "username": "u", "credential": "pw"}
    config = make_config(webrtc={"ice_servers": [turn, {"urls": ["stun:stun.example:3478"]}]})
    async with live_service(detector, shared_nats_server.url, config=config, token=TOKEN) as live:
        assert (await live.call("GET", "/api/webrtc/config", token=None)).status == 401
        reply = await live.call("GET", "/api/webrtc/config")
        assert reply.status == 200 and reply.headers["Cache-Control"] == "no-store"
        assert reply.body == {"ice_servers": [turn, {"urls": ["stun:stun.example:3478"]}]}
