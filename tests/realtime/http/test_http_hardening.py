"""Hostile HTTP against the real service: cross-site and rebinding requests, idle and slow
connections, malformed requests, forged log lines, the metrics render, security headers.
Requests that aiohttp's client will not send go over raw loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import resource
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import realtime.http.metrics
from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.config import ConfigError, load_config
from realtime.http.app import CONNECTION_STATS
from realtime.http.headers import CONTENT_SECURITY_POLICY
from realtime.http.hosts import HostPolicy
from realtime.http.metrics import RENDER_TTL_S
from realtime.logs import KeyValueFormatter
from tests.realtime.http.test_api import assert_error
from tests.support.serve_process import ServeProcess, write_config
from tests.support.service import FAST_SUPERVISOR, LiveService, live_service, make_config
from tests.support.waiting import wait_until

UNREACHABLE = "rtsp://127.0.0.1:1/cam"
STREAM = {"id": "cam", "url": UNREACHABLE, "audio": False}


def address(svc: LiveService) -> tuple[str, int]:
    host, _, port = svc.url.removeprefix("http://").rpartition(":")
    return host, int(port)


async def exchange(svc: LiveService, raw: bytes, *, timeout_s: float = 10) -> tuple[int, dict[str, str], bytes]:
    """One raw request on its own connection: the status, headers and body of the answer."""
    reader, writer = await asyncio.open_connection(*address(svc))
    try:
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout_s)  # the server closes after an error
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


@contextlib.asynccontextmanager
async def service(
    detector: Detector, nats_url: str, token: str | None = None, **http: Any
) -> AsyncIterator[LiveService]:
    async with live_service(detector, nats_url, config=make_config(http=http), token=token) as live:
        yield live


# -- item 10: cross-site requests and DNS rebinding -----------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
async def test_a_body_that_is_not_json_typed_is_415_and_changes_nothing(svc: LiveService, content_type: str) -> None:
    reply = await svc.call("POST", "/api/streams", json_body=STREAM, content_type=content_type)
    assert_error(reply, 415, "application/json")
    assert (await svc.call("POST", "/api/streams", json_body=STREAM, content_type=None)).status == 415
    assert (await svc.call("GET", "/api/streams")).body["streams"] == []


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:1"},  # another port is another origin
        {"Sec-Fetch-Site": "cross-site"},
    ],
)
async def test_a_cross_site_api_request_is_403(svc: LiveService, headers: dict[str, str]) -> None:
    for method in ("POST", "GET"):
        async with svc.session.request(
            method, svc.url + "/api/streams", json=STREAM if method == "POST" else None, headers=headers
        ) as response:
            assert response.status == 403, headers
            body = await response.json()
            assert body["error"] == "cross-site request refused"
    assert (await svc.call("GET", "/api/streams")).body["streams"] == []


async def test_a_same_origin_api_request_is_served(svc: LiveService) -> None:
    headers = {"Origin": svc.url, "Sec-Fetch-Site": "same-origin"}
    async with svc.session.post(svc.url + "/api/streams", json=STREAM, headers=headers) as response:
        assert response.status == 201
    assert (await svc.call("DELETE", "/api/streams/cam")).status == 204


@pytest.mark.parametrize("path", ["/api/streams", "/", "/metrics"])
async def test_a_foreign_host_is_421_so_a_rebinding_page_reads_nothing(svc: LiveService, path: str) -> None:
    port = address(svc)[1]
    async with svc.session.get(svc.url + path, headers={"Host": f"evil.example:{port}"}) as response:
        assert response.status == 421
        body = await response.json()
        assert "http.allowed_hosts" in body["error"] and body["detail"]["host"] == f"evil.example:{port}"
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST", f"[::1]:{port}"):
        async with svc.session.get(svc.url + path, headers={"Host": host}) as response:
            assert response.status == 200, host


def test_the_host_policy() -> None:
    loopback = HostPolicy("127.0.0.1", None, token_set=False)
    assert all(loopback.allows(h) for h in ("127.0.0.1:8080", "localhost", "[::1]:1", "10.1.2.3"))
    assert not any(loopback.allows(h) for h in ("evil.example", "evil.example:8080", "localhost.evil", "a:b:c", ""))
    assert not loopback.allows(None)  # no Host (HTTP/1.0): nothing to check, so no answer
    assert not HostPolicy("0.0.0.0", None, token_set=True).allows(None)
    named = HostPolicy("0.0.0.0", ["vid.example", "cams.local."], token_set=True)
    assert named.allows("VID.example:443") and named.allows("cams.local") and not named.allows("evil.example")
    assert HostPolicy("0.0.0.0", None, token_set=True).allows("anything.example")  # the token stops rebinding
    assert HostPolicy("127.0.0.1", ["*"], token_set=False).allows("anything.example")
    assert HostPolicy("box.lan", None, token_set=False).allows("box.lan:8080")


async def test_allowed_hosts_from_the_config(detector: Detector, shared_nats_server: EmbeddedNatsServer) -> None:
    async with service(detector, shared_nats_server.url, allowed_hosts=["vid.example"]) as svc:
        async with svc.session.get(svc.url + "/api/streams", headers={"Host": "vid.example"}) as response:
            assert response.status == 200
        async with svc.session.get(svc.url + "/api/streams", headers={"Host": "evil.example"}) as response:
            assert response.status == 421


# -- issue 23, Low: requests that carried no Host to check ----------------------------------------


@pytest.mark.parametrize(
    ("raw", "status", "error"),
    [
        (b"GET /api/streams\r\n\r\n", 505, "HTTP version not supported"),  # HTTP/0.9: no headers at all
        (b"GET /api/streams HTTP/0.9\r\n\r\n", 505, "HTTP version not supported"),
        (b"GET /api/streams HTTP/1.0\r\n\r\n", 400, "missing Host header"),
        (b"GET /healthz HTTP/1.0\r\n\r\n", 400, "missing Host header"),
        (b"GET http://evil.example/api/streams HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400, "absolute-form"),
        (b"GET http://127.0.0.1/api/streams HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 400,
         "absolute-form"),
    ],
)
async def test_a_request_without_a_host_to_check_is_refused(
    svc: LiveService, raw: bytes, status: int, error: str
) -> None:
    await svc.call("POST", "/api/streams", json_body=STREAM)
    got, headers, body = await exchange(svc, raw)
    assert got == status, body
    assert headers["Content-Type"].startswith("application/json")
    assert error in json.loads(body)["error"] and b'"streams"' not in body
    # The same request with a Host is served.
    status_ok, _, body_ok = await exchange(svc, b"GET /api/streams HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
    assert status_ok == 200 and json.loads(body_ok)["streams"][0]["id"] == "cam"


# -- item 18: a header that is not UTF-8 ------------------------------------------------------


async def test_a_non_utf8_authorization_header_is_401(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    async with service(detector, shared_nats_server.url, token="s3cret-token") as svc:
        for value in (b"Bearer \xff\xfe", b"Bearer s3cret-token\xe9", b"\xc3\x28 x"):
            head = b"GET /api/streams HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            raw = head + b"Authorization: " + value + b"\r\n\r\n"
            status, _, body = await exchange(svc, raw)
            assert status == 401, (value, body)
            assert json.loads(body)["error"] == "unauthorized"


# -- "Also" and item 16: what aiohttp's parser refuses ------------------------------------------


async def test_an_unparseable_request_gets_the_json_error_body(svc: LiveService) -> None:
    for raw in (
        b"FOO /api/streams HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header: v\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
    ):
        status, headers, body = await exchange(svc, raw)
        assert status == 400 and headers["Content-Type"].startswith("application/json"), (raw[:40], body)
        parsed = json.loads(body)
        assert set(parsed) == {"error", "detail"} and parsed["error"] == "bad request", parsed
        assert headers["X-Content-Type-Options"] == "nosniff"


async def test_a_malformed_header_is_logged_once_per_client_without_its_value(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with service(detector, shared_nats_server.url, token="s3cret-token") as svc:
        raw = b"GET /api/streams HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer s3cret-token\x01x\r\n\r\n"
        with caplog.at_level(logging.DEBUG):
            for _ in range(5):
                status, _, body = await exchange(svc, raw)
                assert status == 400 and b"s3cret" not in body
        records = [r for r in caplog.records if r.getMessage().startswith("malformed HTTP request")]
        assert len(records) == 1 and records[0].reason == "Invalid header value char"  # type: ignore[attr-defined]
        text = "\n".join(f"{r.getMessage()} {vars(r)}" for r in caplog.records)
        assert "s3cret" not in text and not any(r.exc_info for r in caplog.records if r.name.startswith("aiohttp"))
        assert svc.service.app[CONNECTION_STATS].bad_requests == 5
        assert "vidsentry_http_bad_requests_total 5.0" in (await svc.call("GET", "/metrics")).body


def test_a_value_cannot_end_a_log_line_or_forge_one() -> None:
    forged = "rtsp://cam/a\n2030-01-01T00:00:00.000Z error realtime.http 'admin logged in' user=root"
    record = logging.makeLogRecord(
        {"name": "t", "levelname": "INFO", "msg": "stream added\r\nfake", "url": forged, "why": "a\tb", "ok": "plain"}
    )
    line = KeyValueFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\t" not in line
    assert 'url="rtsp://cam/a\\n2030-01-01T00:00:00.000Z error realtime.http \'admin logged in\' user=root"' in line
    assert 'why="a\\tb"' in line and " ok=plain" in line and '"stream added\\r\\nfake"' in line
    assert 'x="say \\"hi\\" \\\\ bye"' in KeyValueFormatter().format(
        logging.makeLogRecord({"name": "t", "levelname": "INFO", "x": 'say "hi" \\ bye'})
    )
    try:
        raise ValueError("bad\n2030-01-01T00:00:00.000Z error forged line\u2028also")
    except ValueError:
        record = logging.makeLogRecord({"name": "t", "levelname": "ERROR", "msg": "failed", "exc_info": sys.exc_info()})
    first, *rest = KeyValueFormatter().format(record).split("\n")
    assert rest and all(line.startswith("  | ") for line in rest)  # a traceback cannot start a record


# -- item 13: idle, slow and too many connections --------------------------------------------


@contextlib.asynccontextmanager
async def idle_connections(svc: LiveService, count: int) -> AsyncIterator[list[asyncio.StreamReader]]:
    """`count` connections to the service that send nothing; closed after the block."""
    opened = [await asyncio.open_connection(*address(svc)) for _ in range(count)]
    try:
        yield [reader for reader, _ in opened]
    finally:
        for _, writer in opened:
            writer.close()


async def test_idle_connections_are_closed_and_never_starve_healthz(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    # An idle timeout far off: every connection the server closes here was closed to make room
    # (a stall of this machine must not let the timeout close some first, uncounted as evictions).
    async with service(detector, shared_nats_server.url, max_connections=8, idle_timeout_s=120.0) as svc:
        stats = svc.service.app[CONNECTION_STATS]
        async with idle_connections(svc, 30) as idle:
            assert stats.open <= 8
            assert (await svc.call("GET", "/healthz")).status == 200  # room is made by closing an idle one
            # The server closes the longest-idle connections to make room, and says nothing on them.
            await wait_until(lambda: sum(reader.at_eof() for reader in idle) >= 22, 20,
                             lambda: f"idle connections closed for room, {sum(r.at_eof() for r in idle)} so far")
            assert stats.evicted >= 22 and stats.refused == 0
            assert stats.open <= 8


async def test_idle_connections_are_closed_after_the_idle_timeout(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    async with service(detector, shared_nats_server.url, idle_timeout_s=1.0) as svc:
        stats = svc.service.app[CONNECTION_STATS]
        async with idle_connections(svc, 3) as idle:
            ends = await asyncio.wait_for(asyncio.gather(*(reader.read() for reader in idle)), 20)
            assert all(end == b"" for end in ends)
            assert stats.evicted == 0  # closed for idleness, not for room
            await wait_until(lambda: stats.open <= 1, 10, "idle connections to be closed")


async def test_a_request_head_sent_slowly_is_cut_off(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    async with service(detector, shared_nats_server.url, idle_timeout_s=1.0) as svc:
        head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 60 + b"\r\n\r\n"
        reader, writer = await asyncio.open_connection(*address(svc))
        closed = asyncio.create_task(reader.read())
        sent = 0
        try:
            for byte in head:  # one byte every 0.2 s: about 20 s for the whole head
                if closed.done():
                    break
                writer.write(bytes([byte]))
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                sent += 1
                await asyncio.sleep(0.2)
            assert closed.done() and closed.result() == b"", "the server waited for the whole slow head"
            assert sent < len(head)
        finally:
            closed.cancel()
            writer.close()


async def test_when_every_connection_is_busy_a_new_one_gets_a_json_503(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    async with service(detector, shared_nats_server.url, max_connections=3) as svc:
        assert (await svc.call("POST", "/api/streams", json_body=STREAM)).status == 201
        viewers = contextlib.AsyncExitStack()
        async with viewers:
            for _ in range(3):  # each event stream keeps its connection busy
                response = await viewers.enter_async_context(svc.session.get(svc.url + "/api/streams/cam/events"))
                assert (await response.content.readline()).startswith(b"retry:")
            status, headers, body = await exchange(svc, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert status == 503 and headers["Retry-After"] == "1"
            assert json.loads(body) == {
                "error": "too many connections",
                "detail": {"limit": 3, "setting": "http.max_connections"},
            }
            assert svc.service.app[CONNECTION_STATS].refused == 1
        await wait_until(lambda: svc.service.fanout.viewer_count == 0, 5, "the viewers to leave")
        assert (await svc.call("GET", "/healthz")).status == 200


async def test_accept_errors_are_logged_at_most_once_per_interval(
    svc: LiveService, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.DEBUG):
        for _ in range(1000):  # what the loop reports for each accept() that hits the fd limit
            loop.call_exception_handler(
                {"message": "socket.accept() out of system resource", "exception": OSError(errno.EMFILE, "Too many")}
            )
    records = [r for r in caplog.records if "accept" in r.getMessage()]
    assert len(records) == 1 and records[0].exc_info is None
    assert svc.service.app[CONNECTION_STATS].accept_errors == 1000


def test_300_idle_connections_under_a_256_fd_limit_leave_healthz_answering(
    shared_nats_server: EmbeddedNatsServer, nudenet_model: Path, tmp_path: Path
) -> None:
    """The issue's reproduction: `serve` as a process, its open-file limit at 256."""
    config = write_config(
        tmp_path / "serve.yaml",
        {
            "detector": {"model": str(nudenet_model), "engine": "onnx-cpu", "threads": 1},
            "supervisor": FAST_SUPERVISOR,
            "http": {"idle_timeout_s": 30},
        },
    )
    serve = ServeProcess("--config", str(config), "--port", "0", "--nats-url", shared_nats_server.url, log_dir=tmp_path)
    with serve.start(wait_for_url=False):
        hard = resource.prlimit(serve.pid, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(serve.pid, resource.RLIMIT_NOFILE, (256, hard))
        url = serve._wait_for_url(60)
        host, port = url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(300)]
        try:
            with socket.create_connection((host, int(port)), timeout=10) as probe:
                probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                answer = b""
                while chunk := probe.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        finally:
            for sock in idle:
                sock.close()
        assert serve.terminate() == 0
    records = serve.log_records()
    capped = [r for r in records if r["msg"].startswith("HTTP connections capped")]
    assert capped and capped[0]["applied"] == 128, records
    assert "Traceback" not in serve.stderr() and len(serve.stderr().splitlines()) < 40


# -- item 21: heartbeat bound, the metrics render, security headers ------------------------------


@pytest.mark.parametrize("value", ["1e-9", "0.5", "0"])
def test_a_heartbeat_below_a_second_is_a_config_error(tmp_path: Path, value: str) -> None:
    path = tmp_path / "vidsentry.yaml"
    path.write_text(f"http:\n  sse_heartbeat_s: {value}\n")
    with pytest.raises(ConfigError, match="http.sse_heartbeat_s"):
        load_config(path, environ={})


async def test_concurrent_scrapes_share_one_render(svc: LiveService, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = svc.service.metrics

    def nothing_cached() -> bool:  # past any render cached by an earlier request
        rendered = metrics._rendered
        return metrics._rendering is None and (rendered is None or time.monotonic() - rendered[0] >= RENDER_TTL_S)

    await wait_until(nothing_cached, 5, "the cached render to expire")
    # The render is held until all 20 scrapes wait for it: shared because it is being made, not
    # because they all happened to arrive within the cache's RENDER_TTL_S.
    asked = 0
    release = threading.Event()
    render_shared, generate_latest = metrics.render_shared, realtime.http.metrics.generate_latest

    async def counted() -> bytes:
        nonlocal asked
        asked += 1
        return await render_shared()

    def held(registry: Any) -> bytes:
        release.wait(30)
        return generate_latest(registry)

    monkeypatch.setattr(metrics, "render_shared", counted)
    monkeypatch.setattr(realtime.http.metrics, "generate_latest", held)
    before = metrics.renders
    try:
        scrapes = asyncio.gather(*(svc.call("GET", "/metrics") for _ in range(20)))
        await wait_until(lambda: asked == 20, 20, lambda: f"20 scrapes waiting, {asked} so far")
    finally:
        release.set()
    replies = await scrapes
    assert all(r.status == 200 for r in replies)
    assert len({r.body for r in replies}) == 1 and "vidsentry_http_connections " in replies[0].body
    assert metrics.renders == before + 1


async def test_every_response_carries_the_security_headers(svc: LiveService) -> None:
    expected = {
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    assert (await svc.call("POST", "/api/streams", json_body=STREAM)).status == 201
    replies = [
        await svc.call(method, path)
        for method, path in (("GET", "/"), ("GET", "/api/streams"), ("GET", "/healthz"), ("GET", "/metrics"),
                             ("GET", "/nowhere"), ("PUT", "/api/streams"), ("GET", "/api/streams/x%20y"))
    ]
    async with svc.session.get(svc.url + "/api/streams/cam/events") as response:
        events_headers = dict(response.headers)
    for headers in [r.headers for r in replies] + [events_headers]:
        for name, value in expected.items():
            assert headers.get(name) == value, (name, headers)
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    page_csp = replies[0].headers["Content-Security-Policy"]
    assert page_csp == CONTENT_SECURITY_POLICY  # the page has no inline script or style to allow
