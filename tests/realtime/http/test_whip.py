"""WHIP (RFC 9725) at the HTTP level, with a real aiortc peer as the client: the status codes and
headers of §4 (201 with the answer, Location, ETag and the ICE servers as Link headers; DELETE
on the Location; trickle PATCH; OPTIONS), every bad request a 4xx with a reason, and the same
session bounds as `/api/webrtc/offer`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.http.test_webrtc_offer import assert_nothing_opened, assert_refused
from tests.support.peer import load_frames, make_offer
from tests.support.service import LiveService, Reply, live_service, make_config
from tests.support.waiting import eventually, wait_until

TOKEN = "whip-token"
SDP = "application/sdp"
FRAGMENT = "application/trickle-ice-sdpfrag"


@pytest.fixture(scope="module")
def frames(vtest_avi: Path) -> list[np.ndarray]:
    return load_frames(vtest_avi, count=5)


@pytest.fixture
async def svc(detector: Detector, shared_nats_server: EmbeddedNatsServer) -> AsyncIterator[LiveService]:
    turn = {"urls": ["turn:turn.example:3478?transport=udp"], "username": "u", "credential": "pw"}
    config = make_config(webrtc={"max_sessions": 1, "ice_servers": [{"urls": ["stun:stun.example:3478"]}, turn]})
    async with live_service(detector, shared_nats_server.url, config=config, token=TOKEN) as live:
        yield live


def header(reply: Reply, name: str) -> str | None:
    """A response header by name, in any case (Reply keeps the headers as a plain dict)."""
    return next((value for key, value in reply.headers.items() if key.lower() == name.lower()), None)


async def offer(frames: list[np.ndarray]) -> RTCPeerConnection:
    pc, _, _ = await make_offer(frames=frames, speech=None)
    return pc


async def test_publish_answers_201_with_the_session_resource_and_delete_ends_it(
    svc: LiveService, frames: list[np.ndarray]
) -> None:
    pc = await offer(frames)
    try:
        auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": SDP}
        async with svc.session.post(svc.url + "/whip/cam-1", data=pc.localDescription.sdp, headers=auth) as response:
            assert response.status == 201, await response.text()
            headers, answer = response.headers, await response.text()
        assert headers["Content-Type"] == SDP
        location = headers["Location"]
        assert location.startswith("/whip/cam-1/") and len(location) > len("/whip/cam-1/") + 16
        assert headers["ETag"].startswith('"') and headers["Accept-Patch"] == FRAGMENT
        assert headers["Cache-Control"] == "no-store"
        assert headers.getall("Link") == [
            '<stun:stun.example:3478>; rel="ice-server"',
            '<turn:turn.example:3478?transport=udp>; rel="ice-server"; username="u"; credential="pw"; '
            'credential-type="password"',
        ]
        assert answer.startswith("v=0") and "a=candidate:" in answer  # non-trickle: every server candidate
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await wait_until(lambda: pc.connectionState == "connected", 15, "the peer to connect")
        stream = await svc.stream("cam-1")
        assert stream["kind"] == "webrtc"

        # The resource is the session: another resource id of the same stream is no session.
        assert_refused(await svc.call("DELETE", "/whip/cam-1/not-the-resource"), 404, "no WHIP session")
        assert_refused(await svc.call("DELETE", location, token=None), 401, "Bearer")
        reply = await svc.call("DELETE", location)
        assert reply.status == 200, reply
        assert svc.service.sessions.ended["stopped"] == 1
        await eventually(lambda: _gone(svc, "cam-1"), 15, "the stream to go")
        assert_refused(await svc.call("DELETE", location), 404, "no WHIP session")
    finally:
        await pc.close()


async def _gone(svc: LiveService, stream_id: str) -> bool:
    return (await svc.call("GET", f"/api/streams/{stream_id}")).status == 404


async def test_trickle_patch_takes_candidates_and_refuses_an_ice_restart(
    svc: LiveService, frames: list[np.ndarray]
) -> None:
    pc = await offer(frames)
    try:
        reply = await svc.call("POST", "/whip/cam-2", data=pc.localDescription.sdp, content_type=SDP)
        assert reply.status == 201, reply
        location, etag = header(reply, "Location"), header(reply, "ETag")
        sdp = pc.localDescription.sdp
        ufrag = next(line for line in sdp.splitlines() if line.startswith("a=ice-ufrag:"))
        pwd = next(line for line in sdp.splitlines() if line.startswith("a=ice-pwd:"))
        mid = next(line for line in sdp.splitlines() if line.startswith("a=mid:"))
        candidate = "a=candidate:1 1 udp 2122260223 192.168.7.9 50000 typ host"
        lines = [ufrag, pwd, "m=video 9 UDP/TLS/RTP/SAVPF 0", mid, candidate, "a=end-of-candidates"]
        fragment = "\r\n".join(lines) + "\r\n"
        refusals = svc.service.sessions.refusals["candidates"]

        reply = await svc.call("PATCH", location, data=fragment, content_type=FRAGMENT)
        assert reply.status == 204, reply
        assert header(reply, "ETag") == etag
        loopback = fragment.replace("192.168.7.9", "127.0.0.1")
        assert (await svc.call("PATCH", location, data=loopback, content_type=FRAGMENT)).status == 204
        assert svc.service.sessions.refusals["candidates"] == refusals + 1  # screened as an offer's are

        restart = fragment.replace(ufrag, "a=ice-ufrag:newufrag")
        assert_refused(await svc.call("PATCH", location, data=restart, content_type=FRAGMENT), 422, "ICE restart")
        assert_refused(await svc.call("PATCH", location, data=fragment, content_type=SDP), 415, FRAGMENT)
        stale = await _patch(svc, location, fragment, {"If-Match": '"other"'})
        assert stale == 412
        assert await _patch(svc, location, fragment, {"If-Match": "*"}) == 204
        garbage = "a=candidate:1 1 udp\r\n"
        assert_refused(await svc.call("PATCH", location, data=garbage, content_type=FRAGMENT), 400, "malformed")
        many = "".join(f"a=candidate:{i} 1 udp 1 192.168.7.{i % 250} {40000 + i} typ host\r\n" for i in range(70))
        assert_refused(await svc.call("PATCH", location, data=mid + "\r\n" + many, content_type=FRAGMENT), 400,
                       "webrtc.max_ice_candidates")
        assert_refused(await svc.call("PATCH", "/whip/cam-2/nope", data=fragment, content_type=FRAGMENT), 404,
                       "no WHIP session")
        assert (await svc.call("DELETE", location)).status == 200
    finally:
        await pc.close()


async def _patch(svc: LiveService, path: str, body: str, headers: dict[str, str]) -> int:
    headers = {**headers, "Authorization": f"Bearer {TOKEN}", "Content-Type": FRAGMENT}
    async with svc.session.patch(svc.url + path, data=body, headers=headers) as response:
        return response.status


async def test_options_and_methods(svc: LiveService) -> None:
    # A CORS preflight carries no token: OPTIONS answers without one, and tells no secret.
    reply = await svc.call("OPTIONS", "/whip/cam-3", token=None)
    assert reply.status == 204 and header(reply, "Accept-Post") == SDP
    assert set((header(reply, "Allow") or "").replace(" ", "").split(",")) == {"OPTIONS", "POST"}
    assert "Link" not in reply.headers and "Access-Control-Allow-Origin" not in reply.headers
    # With the token, OPTIONS names the ICE servers too (clients that configure ICE before offering).
    async with svc.session.options(svc.url + "/whip/cam-3", headers={"Authorization": f"Bearer {TOKEN}"}) as response:
        assert response.status == 204 and len(response.headers.getall("Link")) == 2
    reply = await svc.call("OPTIONS", "/whip/cam-3/anything", token=None)
    assert reply.status == 204 and header(reply, "Accept-Patch") == FRAGMENT
    reply = await svc.call("GET", "/whip/cam-3")
    assert reply.status == 405 and "POST" in (header(reply, "Allow") or "")
    reply = await svc.call("PUT", "/whip/cam-3/anything", data="x", content_type=SDP)
    assert reply.status == 405 and "DELETE" in (header(reply, "Allow") or "")


async def test_bad_publishes_are_4xx_with_a_reason(svc: LiveService, frames: list[np.ndarray]) -> None:
    pc = await offer(frames)
    sdp = pc.localDescription.sdp
    await pc.close()
    assert_refused(await svc.call("POST", "/whip/cam-4", data=sdp, token=None), 401, "Bearer")
    assert_refused(await svc.call("POST", "/whip/cam-4", data=sdp, token="wrong"), 401, "not valid")
    reply = await svc.call("POST", "/whip/cam-4", data=sdp, content_type="application/json")
    assert_refused(reply, 415, SDP)
    assert header(reply, "Accept-Post") == SDP
    assert_refused(await svc.call("POST", "/whip/cam-4", data="", content_type=SDP), 400, "missing body")
    assert_refused(await svc.call("POST", "/whip/cam-4", data=b"\xff\xfe", content_type=SDP), 400, "UTF-8")
    assert_refused(await svc.call("POST", "/whip/cam-4", data="hello", content_type=SDP), 400, "v=0")
    truncated = sdp[: len(sdp) // 2]
    assert_refused(await svc.call("POST", "/whip/cam-4", data=truncated, content_type=SDP), 400, "invalid offer")
    assert_refused(await svc.call("POST", "/whip/bad.id", data=sdp, content_type=SDP), 400, "invalid stream id")
    huge = "v=0\r\n" + "a=x\r\n" * 9000
    assert_refused(await svc.call("POST", "/whip/cam-4", data=huge, content_type=SDP), 400, "webrtc.max_sdp_bytes")
    # Cross-site: no form or script of another site may publish.
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": SDP, "Origin": "https://evil.example"}
    async with svc.session.post(svc.url + "/whip/cam-4", data=sdp, headers=headers) as response:
        assert response.status == 403
    await assert_nothing_opened(svc)


async def test_sessions_are_bounded_as_offers_are(svc: LiveService, frames: list[np.ndarray]) -> None:
    first, second = await offer(frames), await offer(frames)
    try:
        reply = await svc.call("POST", "/whip/cam-5", data=first.localDescription.sdp, content_type=SDP)
        assert reply.status == 201, reply
        again = await svc.call("POST", "/whip/cam-5", data=second.localDescription.sdp, content_type=SDP)
        assert_refused(again, 503, "webrtc.max_sessions")
        assert header(again, "Retry-After")
        await svc.call("DELETE", header(reply, "Location") or "")
    finally:
        await first.close()
        await second.close()


async def test_whip_and_a_camera_share_the_stream_namespace(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, frames: list[np.ndarray], vtest_avi: Path
) -> None:
    async with live_service(detector, shared_nats_server.url, config=make_config()) as live:
        added = await live.call("POST", "/api/streams", json_body={"id": "taken", "url": str(vtest_avi)})
        assert added.status == 201, added
        pc = await offer(frames)
        try:
            reply = await live.call("POST", "/whip/taken", data=pc.localDescription.sdp, content_type=SDP)
            assert_refused(reply, 409, "stream exists")
        finally:
            await pc.close()


async def test_the_close_token_header_ends_the_session_by_beacon(svc: LiveService, frames: list[np.ndarray]) -> None:
    # The page's pagehide beacon cannot DELETE or send the bearer token: it sends the close token
    # the 201 carried in a header of its own.
    pc = await offer(frames)
    try:
        reply = await svc.call("POST", "/whip/cam-6", data=pc.localDescription.sdp, content_type=SDP)
        assert reply.status == 201, reply
        token = header(reply, "Vidsentry-Close-Token")
        assert token
        beacon = json.dumps({"stream_id": "cam-6", "close_token": token})
        closed = await svc.call("POST", "/api/webrtc/close", data=beacon, content_type="text/plain", token=None)
        assert closed.status == 204, closed
        assert "cam-6" not in svc.service.sessions
        assert svc.service.sessions.ended["the page went away"] == 1
    finally:
        await pc.close()
