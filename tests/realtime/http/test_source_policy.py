"""What an API client may point the service at, and what it may learn back, through the real service.

Streams added over the API are checked against `sources:` (network schemes, public hosts, no
local files, by default); config-file streams are trusted. URLs with control characters are
refused before anything connects, and secrets in URLs never come back in responses or events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.sources.supervisor import UNTRUSTED_REASON
from tests.support.service import LiveService, Reply, live_service, make_config
from tests.support.sse import sse_events
from tests.support.waiting import wait_until

STRICT = {"allow_private_hosts": False, "allow_local_hosts": False, "local_dirs": []}


def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Listener:
    """A loopback TCP server that records every byte it is sent and never answers."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._clients: list[tuple[asyncio.StreamWriter, asyncio.Task[Any]]] = []

    async def __aenter__(self) -> Listener:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer, _task in self._clients:
            writer.close()
        await asyncio.gather(*(task for _writer, task in self._clients), return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.append((writer, task))
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(4096):
                self.received += data
        writer.close()


def url_problem(reply: Reply) -> str:
    """The message of a 400 that names the `url` field (AssertionError for anything else)."""
    assert reply.status == 400 and reply.is_json, reply
    problems = [p for p in reply.body["detail"] if p["field"] == "url"]
    assert problems and reply.body["error"].startswith("invalid stream: url: "), reply.body
    return str(problems[0]["message"])


@contextlib.asynccontextmanager
async def service(
    detector: Detector, nats: EmbeddedNatsServer, streams: list[dict[str, Any]] | None = None, **sources: Any
) -> AsyncIterator[LiveService]:
    config = make_config(sources={**STRICT, **sources}, streams=streams or [])
    async with live_service(detector, nats.url, config=config) as svc:
        yield svc


async def test_a_url_with_cr_lf_is_refused_and_reaches_no_camera(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    """Issue 7, item 9: the CR/LF used to go out as extra RTSP request lines to any host:port."""
    async with Listener() as camera, service(detector, shared_nats_server, allow_local_hosts=True) as svc:
        base = f"rtsp://127.0.0.1:{camera.port}"
        injected = f"{base}/a\r\nX-Injected: yes\r\nCSeq: 99\r\n\r\nTEARDOWN {base}/other"
        for url in (injected, f"{base}/a%0d%0aX-Injected:%20yes", f"{base}/a b", f"{base}/" + "a" * 3000):
            url_problem(await svc.call("POST", "/api/streams", json_body={"id": "inject", "url": url}))
        assert (await svc.call("GET", "/api/streams")).body["streams"] == []
        # A good URL to the same listener: once its request has arrived, the refused ones would have too.
        assert (await svc.call("POST", "/api/streams", json_body={"id": "probe", "url": f"{base}/ok"})).status == 201
        await wait_until(lambda: b"/ok RTSP/1.0\r\n" in camera.received, 20, "the good request")
    assert b"X-Injected" not in camera.received and b"/a" not in camera.received, bytes(camera.received)


async def test_api_clients_may_not_open_local_files_devices_or_internal_hosts(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    """Issue 7, item 14, with the default `sources:` policy."""
    port = closed_port()
    fifo = tmp_path / "pipe.mp4"
    os.mkfifo(fifo)
    refused = {
        "/etc/passwd": "local files are not allowed",
        "/etc/no-such-file": "local files are not allowed",  # the same answer: no existence oracle
        "file:///etc/passwd": "local files are not allowed",
        "/proc/self/environ": "local files are not allowed",
        "/dev/ptmx": "local files are not allowed",
        str(fifo): "local files are not allowed",
        f"http://127.0.0.1:{port}/": "a loopback address",
        f"rtsp://localhost:{port}/x": "a loopback address",
        "rtsp://[::1]/x": "a loopback address",
        "rtsp://[::ffff:127.0.0.1]/x": "a loopback address",
        "rtsp://2130706433/x": "a loopback address",  # 127.0.0.1 as a number
        "http://10.1.2.3/x": "a private address (sources.allow_private_hosts is off)",
        "http://169.254.169.254/latest/meta-data": "a cloud metadata address",
        "rtsp://[fd00:ec2::254]/x": "a cloud metadata address",
        "rtsp://no-such-host.invalid/x": "does not resolve",
    }
    async with service(detector, shared_nats_server) as svc:
        for url, needle in refused.items():
            message = url_problem(await svc.call("POST", "/api/streams", json_body={"id": "x", "url": url}))
            assert needle in message, (url, message)
            assert "environ" not in message and str(os.getpid()) not in message
        assert (await svc.call("GET", "/api/streams")).body["streams"] == []


async def test_local_files_only_under_local_dirs_and_only_regular_ones(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, tmp_path: Path, sample_clip: Path
) -> None:
    allowed = tmp_path / "media"
    allowed.mkdir()
    os.mkfifo(allowed / "pipe.mp4")
    (allowed / "passwd.mp4").symlink_to("/etc/passwd")
    (allowed / "proc").symlink_to("/proc/self")
    dirs = [str(allowed), str(sample_clip.parent)]
    async with service(detector, shared_nats_server, local_dirs=dirs) as svc:
        cases = {
            str(allowed / "pipe.mp4"): "not a regular file",
            str(allowed / "passwd.mp4"): "allowed only under sources.local_dirs",  # wherever a link points
            str(allowed / "proc" / "environ"): "allowed only under sources.local_dirs",
            f"{allowed}/../../../etc/passwd": "allowed only under sources.local_dirs",
            "/etc/passwd": "allowed only under sources.local_dirs",
        }
        for url, needle in cases.items():
            message = url_problem(await svc.call("POST", "/api/streams", json_body={"id": "x", "url": url}))
            assert needle in message, (url, message)
        body = {"id": "clip", "url": str(sample_clip), "detect_fps": 2}
        assert (await svc.call("POST", "/api/streams", json_body=body)).status == 201
        await svc.wait_for_state("clip", "live")


async def test_api_streams_get_generic_failure_reasons_config_streams_the_detail(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused port and a silent one must not read differently to an API client (a port scanner);
    the operator's own streams, and the log, keep the detail."""
    caplog.set_level(logging.INFO, logger="realtime.sources.supervisor")
    port = closed_port()
    url = f"rtsp://127.0.0.1:{port}/x"
    streams = [{"id": "from-config", "url": url, "audio": False}]
    async with service(detector, shared_nats_server, allow_local_hosts=True, streams=streams) as svc:
        assert (await svc.call("POST", "/api/streams", json_body={"id": "from-api", "url": url})).status == 201
        reasons = {}
        for stream_id in ("from-config", "from-api"):
            await svc.wait_for_state(stream_id, "reconnecting")
            reasons[stream_id] = (await svc.stream(stream_id))["reason"]
    assert reasons == {"from-config": f"connection refused by 127.0.0.1:{port}", "from-api": UNTRUSTED_REASON}
    logged = [r for r in caplog.records if getattr(r, "stream_id", None) == "from-api" and r.__dict__.get("reason")]
    assert any(f"connection refused by 127.0.0.1:{port}" in r.__dict__["reason"] for r in logged)


async def test_secrets_in_urls_never_come_back(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 7, item 17: the password was replaced as a substring ("refused ***y 127.0.0.1"), and
    query-string tokens and lone user names were shown in full."""
    caplog.set_level(logging.DEBUG)
    port = closed_port()
    config_url = f"rtsp://a:b@127.0.0.1:{port}/x"
    api_url = f"rtsp://tok3n-user-0123@127.0.0.1:{port}/x?token=s3cr3t-t0ken-9876&ch=1"
    api_display = f"rtsp://***@127.0.0.1:{port}/x?token=***&ch=1"
    streams = [{"id": "cfg", "url": config_url, "audio": False}]
    async with service(detector, shared_nats_server, allow_local_hosts=True, streams=streams) as svc:
        reply = await svc.call("POST", "/api/streams", json_body={"id": "api", "url": api_url})
        assert reply.status == 201 and reply.body["url"] == api_display
        events: list[dict[str, Any]] = []
        async with svc.session.get(svc.url + "/api/streams/api/events") as response:
            reader = asyncio.create_task(read_status_events(response, events))
            await wait_until(lambda: any(e["state"] == "reconnecting" for e in events), 20, "a status event")
            reader.cancel()
        await svc.wait_for_state("cfg", "reconnecting")
        cfg = await svc.stream("cfg")
        pages = [(await svc.call("GET", path)).body for path in ("/api/streams", "/metrics", "/")]
        everything = json.dumps(pages)
    assert cfg["url"] == f"rtsp://a:***@127.0.0.1:{port}/x"
    assert cfg["reason"] == f"connection refused by 127.0.0.1:{port}"  # not "refused ***y"
    assert {e["source"] for e in events} == {api_display}
    for secret in ("s3cr3t-t0ken-9876", "tok3n-user-0123"):
        assert secret not in everything and secret not in json.dumps(events)
        assert not any(secret in r.getMessage() or secret in str(vars(r)) for r in caplog.records)


async def read_status_events(response: aiohttp.ClientResponse, into: list[dict[str, Any]]) -> None:
    """The `data` of every `status` event of a server-sent event stream."""
    async for event in sse_events(response):
        if event["event"] == "status":
            into.append(event["data"])


async def test_by_default_cameras_on_private_networks_are_welcome_and_this_host_is_not(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    """Issue 23: nearly every camera lives on an RFC 1918 / ULA network; loopback, link-local, the
    metadata addresses and the service's own port are refused unless an operator allows them."""
    defaults = {"allow_private_hosts": True, "allow_local_hosts": False, "local_dirs": []}
    async with service(detector, shared_nats_server, **defaults) as svc:
        for sid, url in (("lan", "rtsp://10.1.2.3:554/stream1"), ("ula", "rtsp://[fd12:3456::7]/live")):
            reply = await svc.call("POST", "/api/streams", json_body={"id": sid, "url": url})
            assert reply.status == 201, reply
        own = svc.url.rsplit(":", 1)[1]
        refused = {
            "rtsp://127.0.0.1/x": "sources.allow_local_hosts",
            "rtsp://[fe80::1]/x": "a link-local address",
            "http://169.254.169.254/latest": "a cloud metadata address",
            "rtsp://224.0.0.1/x": "a multicast address",
            "rtsp://0.0.0.0/x": "an unspecified address",
        }
        for url, needle in refused.items():
            message = url_problem(await svc.call("POST", "/api/streams", json_body={"id": "x", "url": url}))
            assert needle in message, (url, message)
    async with service(detector, shared_nats_server, allow_local_hosts=True) as svc:
        own = svc.url.rsplit(":", 1)[1]
        message = url_problem(
            await svc.call("POST", "/api/streams", json_body={"id": "me", "url": f"http://127.0.0.1:{own}/"})
        )
        assert "this service's own port" in message, message
