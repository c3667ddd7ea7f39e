"""The HTTP API against a real service: real RTSP camera, real nats-server, real detector."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.rtsp import RtspServer
from tests.support.service import LiveService, Reply, live_service, make_config
from tests.support.sse import read_sse
from tests.support.waiting import eventually, wait_until

UNREACHABLE = "rtsp://127.0.0.1:1/cam"  # refused at once; the stream keeps retrying, cheaply


def assert_error(reply: Reply, status: int, *needles: str) -> None:
    """A JSON error with a reason, never a 500."""
    assert reply.status == status, reply
    assert reply.is_json, reply
    assert set(reply.body) == {"error", "detail"}, reply.body
    text = json.dumps(reply.body).lower()
    for needle in needles:
        assert needle.lower() in text, reply.body
    assert "traceback" not in text


def camera(rtsp_server: RtspServer, stream_id: str, **extra: Any) -> dict[str, Any]:
    return {"id": stream_id, "url": rtsp_server.url("/test"), "detect_fps": 5, "audio": False, **extra}


async def test_add_list_get_delete_and_add_again(svc: LiveService, rtsp_server: RtspServer) -> None:
    crowd = {"id": "crowd", "type": "count", "above": 5, "severity": "info"}
    reply = await svc.call("POST", "/api/streams", json_body=camera(rtsp_server, "gate", rules=[crowd]))
    assert reply.status == 201, reply
    assert reply.headers["Location"] == "/api/streams/gate"
    assert reply.body["id"] == "gate" and reply.body["url"] == rtsp_server.url("/test")
    assert [(r["id"], r["type"], r["above"]) for r in reply.body["rules"]] == [("crowd", "count", 5)]
    assert reply.body["detect_fps"] == 5 and reply.body["state"] in ("pending", "connecting")

    listed = (await svc.call("GET", "/api/streams")).body["streams"]
    assert [s["id"] for s in listed] == ["gate"]
    await svc.wait_for_state("gate", "live", min_processed=2)
    body = await svc.stream("gate")
    assert body["counters"]["frames_in"] >= body["counters"]["frames_processed"] >= 2
    assert body["reason"] is None and body["restarts"] == 0

    assert (await svc.call("DELETE", "/api/streams/gate")).status == 204
    assert_error(await svc.call("GET", "/api/streams/gate"), 404, "unknown stream", "gate")
    assert (await svc.call("GET", "/api/streams")).body["streams"] == []
    registry = svc.service.registry
    await wait_until(lambda: registry.running_count == 0, 15, "the deleted stream to stop")

    # The same id again is a new stream that starts from scratch.
    reply = await svc.call("POST", "/api/streams", json_body=camera(rtsp_server, "gate"))
    assert reply.status == 201, reply
    await svc.wait_for_state("gate", "live", min_processed=1)
    assert (await svc.call("DELETE", "/api/streams/gate")).status == 204


async def test_removing_a_stream_leaves_the_others_alone(svc: LiveService, rtsp_server: RtspServer) -> None:
    for stream_id in ("left", "right"):
        assert (await svc.call("POST", "/api/streams", json_body=camera(rtsp_server, stream_id))).status == 201
    for stream_id in ("left", "right"):
        await svc.wait_for_state(stream_id, "live", min_processed=1)
    registry = svc.service.registry
    runner_before = registry._running["right"].runner

    assert (await svc.call("DELETE", "/api/streams/left")).status == 204
    await wait_until(lambda: registry.running_count == 1, 15, "left to stop")
    processed = (await svc.stream("right"))["counters"]["frames_processed"]
    await svc.wait_for_state("right", "live", min_processed=processed + 3)
    # The same run, never restarted or paused.
    assert registry._running["right"].runner is runner_before
    assert (await svc.stream("right"))["restarts"] == 0


async def test_duplicate_id_is_409(svc: LiveService) -> None:
    assert (await svc.call("POST", "/api/streams", json_body={"id": "dup", "url": UNREACHABLE})).status == 201
    assert_error(await svc.call("POST", "/api/streams", json_body={"id": "dup", "url": UNREACHABLE}), 409, "dup")
    assert (await svc.call("DELETE", "/api/streams/dup")).status == 204


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        pytest.param(b"{not json", ("bad json",), id="not-json"),
        pytest.param(b"", ("missing body",), id="empty"),
        pytest.param(b"\xff\xfe\x00garbage", ("bad json",), id="not-utf8"),
        pytest.param(b"[" * 20_000 + b"]" * 20_000, ("bad json",), id="deeply-nested"),
        pytest.param(b'[{"id": "a", "url": "rtsp://c/1"}]', ("one stream object",), id="a-list"),
        pytest.param(b'"just a string"', ("one stream object",), id="a-string"),
        pytest.param(
            {"id": "a", "url": "rtsp://c/1", "colour": "red"}, ("colour", "unknown field"), id="unknown-field"
        ),
        pytest.param({"id": "a", "url": "ftp://c/1"}, ("url", "scheme"), id="bad-scheme"),
        pytest.param({"id": "a", "url": "rtsp://:99999/x"}, ("url",), id="bad-port"),
        pytest.param({"id": "a", "url": "/no/such/clip.mp4"}, ("url", "no such file"), id="missing-file"),
        pytest.param({"id": "a"}, ("url", "required"), id="no-url"),
        pytest.param({"url": "rtsp://c/1"}, ("id", "required"), id="no-id"),
        pytest.param({"id": "front door!", "url": "rtsp://c/1"}, ("id", "1-64 characters"), id="bad-id"),
        pytest.param({"id": "x" * 65, "url": "rtsp://c/1"}, ("id",), id="long-id"),
        pytest.param({"id": 7, "url": "rtsp://c/1"}, ("id", "string"), id="numeric-id"),
        pytest.param({"id": "a", "url": "rtsp://c/1", "detect_fps": -1}, ("detect_fps",), id="negative-fps"),
        pytest.param({"id": "a", "url": "rtsp://c/1", "ingest": "vlc"}, ("ingest",), id="bad-ingest"),
        pytest.param({"id": "a", "url": "rtsp://c/1", "rules": "none"}, ("rules",), id="bad-rules"),
        pytest.param(
            {"id": "a", "url": "rtsp://c/1", "rules": [{"id": "r", "type": "teleport"}]},
            ("rules.0", "not a rule type"),
            id="unknown-rule-type",
        ),
        pytest.param(
            {"id": "a", "url": "rtsp://c/1", "rules": [{"id": "r", "type": "count"}]},
            ("rules.0.count", "above or below"),
            id="incomplete-rule",
        ),
    ],
)
async def test_bad_stream_objects_are_400_naming_the_field(
    svc: LiveService, body: dict[str, Any] | bytes, needles: tuple[str, ...]
) -> None:
    if isinstance(body, bytes):
        reply = await svc.call("POST", "/api/streams", data=body)
    else:
        reply = await svc.call("POST", "/api/streams", json_body=body)
    assert_error(reply, 400, *needles)
    assert (await svc.call("GET", "/api/streams")).body["streams"] == []


async def test_a_password_in_the_url_is_never_shown(svc: LiveService) -> None:
    reply = await svc.call("POST", "/api/streams", json_body={"id": "cam", "url": "rtsp://admin:hunter2@127.0.0.1:1/s"})
    assert reply.status == 201 and "hunter2" not in json.dumps(reply.body)
    assert reply.body["url"] == "rtsp://admin:***@127.0.0.1:1/s"
    for path in ("/api/streams", "/api/streams/cam", "/metrics", "/"):
        assert "hunter2" not in json.dumps((await svc.call("GET", path)).body), path


@pytest.mark.parametrize(
    ("method", "path", "status", "needles"),
    [
        ("GET", "/api/streams/front%20door", 400, ("invalid stream id",)),
        ("DELETE", "/api/streams/front%20door", 400, ("invalid stream id",)),
        ("GET", "/api/streams/front%20door/events", 400, ("invalid stream id",)),
        ("GET", "/api/streams/nobody", 404, ("unknown stream", "nobody")),
        ("DELETE", "/api/streams/nobody", 404, ("unknown stream", "nobody")),
        ("GET", "/api/streams/nobody/events", 404, ("unknown stream", "nobody")),
        ("GET", "/api/nothing-here", 404, ("not found", "/api/nothing-here")),
        ("GET", "/no/such/page", 404, ("not found",)),
        ("PUT", "/api/streams", 405, ("method not allowed", "PUT", "POST")),
        ("PATCH", "/api/streams/x", 405, ("method not allowed", "DELETE")),
        ("POST", "/healthz", 405, ("method not allowed",)),
    ],
)
async def test_bad_paths_and_methods_are_json_4xx(
    svc: LiveService, method: str, path: str, status: int, needles: tuple[str, ...]
) -> None:
    reply = await svc.call(method, path)
    assert_error(reply, status, *needles)
    if status == 405:
        assert "Allow" in reply.headers


async def test_a_body_over_the_limit_is_413_json(svc: LiveService) -> None:
    reply = await svc.call("POST", "/api/streams", data=b'{"id": "a", "pad": "' + b"x" * 100_000 + b'"}')
    assert_error(reply, 413, "max_bytes")


async def test_an_unexpected_failure_is_a_json_500_without_a_trace(
    svc: LiveService, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> list[Any]:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(svc.service.registry, "views", broken)
    with caplog.at_level(logging.ERROR, logger="realtime.http.errors"):
        reply = await svc.call("GET", "/api/streams")
    assert_error(reply, 500, "internal error")
    assert "secret internals" not in json.dumps(reply.body)
    assert any("secret internals" in (r.exc_text or "") for r in caplog.records)  # the log has it


async def test_bearer_token_guards_the_api_only(detector: Detector, shared_nats_server: EmbeddedNatsServer) -> None:
    async with live_service(detector, shared_nats_server.url, token="s3cret-token") as svc:
        missing = await svc.call("GET", "/api/streams", token=None)
        assert_error(missing, 401, "unauthorized", "bearer")
        assert missing.headers["WWW-Authenticate"].startswith("Bearer")
        assert_error(await svc.call("GET", "/api/streams", token="s3cret-tokeN"), 401, "not valid")
        assert_error(await svc.call("GET", "/api/streams", token=""), 401)
        assert_error(await svc.call("POST", "/api/streams", token=None, json_body={"id": "a"}), 401)
        assert_error(await svc.call("GET", "/api/streams/x/events", token=None), 401)
        assert_error(await svc.call("GET", "/api/unknown", token=None), 401)  # no probing for routes
        async with svc.session.get(svc.url + "/api/streams", headers={"Authorization": "Basic czNjcmV0"}) as r:
            assert r.status == 401
        assert (await svc.call("GET", "/api/streams")).status == 200
        # Probes, metrics and the page need no token; the page shows no stream data without one.
        for path in ("/healthz", "/readyz", "/metrics", "/"):
            assert (await svc.call("GET", path, token=None)).status == 200, path
        assert "bearer token" in (await svc.call("GET", "/", token=None)).body


async def test_probes_metrics_and_draining(svc: LiveService, rtsp_server: RtspServer) -> None:
    assert (await svc.call("GET", "/healthz")).body == {"status": "ok"}
    ready = await svc.call("GET", "/readyz")
    assert ready.status == 200 and ready.body["checks"] == {
        "nats": True,
        "jetstream": True,
        "publisher": True,
        "detector": True,
        "detector_responsive": True,
        "accepting": True,
    }

    assert (await svc.call("POST", "/api/streams", json_body=camera(rtsp_server, "m1"))).status == 201
    await svc.wait_for_state("m1", "live", min_processed=3)

    fps_in = 'vidsentry_stream_fps{stage="in",stream="m1"}'

    async def with_a_frame_rate() -> Reply | None:  # two frame-rate samples apart: a rate, not a zero
        reply = await svc.call("GET", "/metrics")
        line = next((line for line in reply.body.splitlines() if line.startswith(fps_in)), "")
        return reply if line and float(line.split()[-1]) > 0 else None

    reply = await eventually(with_a_frame_rate, 10, "a frame rate for m1 in /metrics")
    assert reply.headers["Content-Type"].startswith("text/plain")
    text = reply.body
    for needle in (
        'vidsentry_stream_frames_total{stage="processed",stream="m1"}',
        'vidsentry_stream_fps{stage="in",stream="m1"}',
        'vidsentry_stream_queue_depth{queue="mailbox",stream="m1"}',
        'vidsentry_stream_queue_depth{queue="status",stream="m1"}',
        'vidsentry_stream_audio_buffered_seconds{stream="m1"}',
        'vidsentry_stream_state{state="live",stream="m1"} 1.0',
        'vidsentry_stream_reconnects_total{stream="m1"}',
        'vidsentry_stream_stalls_total{stream="m1"}',
        'vidsentry_inference_seconds_bucket{le="0.05",stream="m1"}',
        'vidsentry_capture_to_publish_seconds_count{stream="m1"}',
        'vidsentry_events_published_total{kind="detections"}',
        'vidsentry_events_acked_total{kind="status"}',
        'vidsentry_events_failed_total{kind="status"} 0.0',
        "vidsentry_nats_connected 1.0",
        "vidsentry_detector_frames_total",
        "vidsentry_sse_viewers 0.0",
        "vidsentry_sse_open_alerts_forgotten_total 0.0",
        "vidsentry_asyncio_tasks",
        "process_resident_memory_bytes",
    ):
        assert needle in text, needle
    fps_line = next(line for line in text.splitlines() if line.startswith(fps_in))
    assert float(fps_line.split()[-1]) > 0

    # Draining: reads still work, changes are refused, readiness fails.
    svc.service.context.draining = True
    assert_error(await svc.call("GET", "/readyz"), 503, "not ready", "accepting")
    assert_error(await svc.call("POST", "/api/streams", json_body=camera(rtsp_server, "m2")), 503, "shutting down")
    assert_error(await svc.call("DELETE", "/api/streams/m1"), 503, "shutting down")
    assert (await svc.call("GET", "/api/streams/m1")).status == 200
    svc.service.context.draining = False


async def test_events_reach_a_viewer_and_end_with_the_stream(svc: LiveService, rtsp_server: RtspServer) -> None:
    assert (await svc.call("POST", "/api/streams", json_body=camera(rtsp_server, "sse"))).status == 201
    events: list[dict[str, Any]] = []
    async with svc.session.get(svc.url + "/api/streams/sse/events") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        reader = asyncio.create_task(read_sse(response, events))
        await wait_until(lambda: sum(e["event"] == "detections" for e in events) >= 3, 20, "detections")
        assert svc.service.fanout.viewer_count == 1
        assert (await svc.call("DELETE", "/api/streams/sse")).status == 204
        await asyncio.wait_for(reader, 15)  # the response ends once the stream's run has ended

    first = events[0]
    assert first["event"] == "stream" and first["data"]["id"] == "sse"
    detections = [e for e in events if e["event"] == "detections"]
    assert all(e["data"]["stream_id"] == "sse" and "objects" in e["data"] for e in detections)
    assert all(len(e["id"]) >= 8 for e in detections)  # the ce-id, for Last-Event-ID bookkeeping
    states = [e["data"]["state"] for e in events if e["event"] == "status"]
    assert states[-1] == "stopped", states
    assert not any(e["event"] == "lag" for e in events)
    await wait_until(lambda: svc.service.fanout.viewer_count == 0, 5, "the viewer to be released")


async def test_a_viewer_that_disconnects_is_released(svc: LiveService, rtsp_server: RtspServer) -> None:
    assert (await svc.call("POST", "/api/streams", json_body=camera(rtsp_server, "gone"))).status == 201
    fanout = svc.service.fanout
    for _ in range(3):
        async with svc.session.get(svc.url + "/api/streams/gone/events") as response:
            assert (await response.content.readline()).startswith(b"retry:")
            assert fanout.viewer_count == 1
        await wait_until(lambda: fanout.viewer_count == 0, 5, "the server to notice the disconnect")
    assert (await svc.call("DELETE", "/api/streams/gone")).status == 204


async def test_config_streams_start_with_the_service(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, sample_clip: Path
) -> None:
    config = make_config(streams=[{"id": "from-config", "url": str(sample_clip), "detect_fps": 2}])
    async with live_service(detector, shared_nats_server.url, config=config) as svc:
        await svc.wait_for_state("from-config", "live", min_processed=1)


async def test_no_odd_request_is_ever_a_500(svc: LiveService) -> None:
    paths = [
        "/", "/api", "/api/", "/api/streams/", "/api/streams//events", "/api/streams/%00", "/api/streams/a/events/x",
        "/api/streams/" + "a" * 300, "/metrics/", "/%ff", "/api/streams?x=1", "//api/streams",
        "/api/streams/..%2fmetrics",
    ]
    bodies: list[bytes | None] = [None, b"null", b"{}", b"[]", b"{\"id\": null, \"url\": null}", b"\x00" * 10]
    seen = set()
    for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"):
        for path in paths:
            for body in bodies if method in ("POST", "PUT", "PATCH") else [None]:
                reply = await svc.call(method, path, data=body)
                seen.add(reply.status)
                assert reply.status < 500, (method, path, body, reply)
                if reply.status >= 400:
                    assert reply.is_json and "error" in reply.body, (method, path, reply)
    assert {400, 404, 405} <= seen
    assert (await svc.call("GET", "/api/streams")).body["streams"] == []
    # A method token aiohttp's HTTP parser does not know never reaches the app: a plain-text 400.
    assert (await svc.call("FOO", "/api/streams")).status == 400
