"""Bounds of the service: how many streams it holds and how many event viewers it serves.

Past a bound a request is a JSON 429 naming the config key of the limit; nothing half-happens.
The HTTP tests run the real service (real nats-server, real detector); the streams point at a
camera that refuses at once, since only the desired set and the viewers matter here.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.config import CameraStreamSettings, ConfigError, HttpSettings, load_config
from realtime.streams.registry import StreamLimitReached, StreamRegistry
from realtime.streams.runner import StreamRunner
from tests.realtime.http.test_api import assert_error
from tests.support.service import LiveService, live_service, make_config
from tests.support.waiting import wait_until

UNREACHABLE = "rtsp://127.0.0.1:1/cam"  # refused at once; the stream keeps retrying, cheaply


def stream(stream_id: str) -> dict[str, Any]:
    return {"id": stream_id, "url": UNREACHABLE, "audio": False}


@contextlib.asynccontextmanager
async def bounded_service(detector: Detector, nats_url: str, **http: Any) -> AsyncIterator[LiveService]:
    config = make_config(http=http)
    async with live_service(detector, nats_url, config=config) as live:
        yield live


@contextlib.asynccontextmanager
async def viewer(live: LiveService, stream_id: str) -> AsyncIterator[None]:
    """An open event stream that has had its first line."""
    async with live.session.get(f"{live.url}/api/streams/{stream_id}/events") as response:
        assert response.status == 200
        assert (await response.content.readline()).startswith(b"retry:")
        yield


# -- the number of streams --------------------------------------------------------------


async def test_a_stream_past_the_limit_is_429_and_a_delete_frees_its_slot(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    async with bounded_service(detector, shared_nats_server.url, max_streams=2) as svc:
        registry = svc.service.registry
        for stream_id in ("one", "two"):
            assert (await svc.call("POST", "/api/streams", json_body=stream(stream_id))).status == 201
        refused = await svc.call("POST", "/api/streams", json_body=stream("three"))
        assert_error(refused, 429, "stream limit reached: 2 streams (http.max_streams)")
        assert refused.body["detail"] == {"limit": 2, "setting": "http.max_streams"}
        assert registry.rejected == 1
        assert [s["id"] for s in (await svc.call("GET", "/api/streams")).body["streams"]] == ["one", "two"]
        assert_error(await svc.call("GET", "/api/streams/three"), 404)
        # An id that exists is still a conflict, not a limit.
        assert_error(await svc.call("POST", "/api/streams", json_body=stream("two")), 409, "stream exists")

        assert (await svc.call("DELETE", "/api/streams/one")).status == 204
        assert (await svc.call("POST", "/api/streams", json_body=stream("three"))).status == 201
        assert_error(await svc.call("POST", "/api/streams", json_body=stream("four")), 429, "http.max_streams")
        assert registry.rejected == 2
        assert sorted(s["id"] for s in (await svc.call("GET", "/api/streams")).body["streams"]) == ["three", "two"]


async def test_the_registry_bounds_add_and_apply_alike() -> None:
    def no_runs(settings: CameraStreamSettings) -> StreamRunner:
        raise AssertionError("nothing runs in this test")

    registry = StreamRegistry(no_runs, max_streams=2)
    one, two, three = (CameraStreamSettings(id=i, url=UNREACHABLE) for i in ("one", "two", "three"))
    registry.apply([one, two])
    with pytest.raises(StreamLimitReached, match=r"2 streams \(http\.max_streams\)"):
        registry.add(three)
    # A config with more streams than the limit is refused whole; the current set stays.
    with pytest.raises(StreamLimitReached, match="http.max_streams") as refused:
        registry.apply([one, two, three])
    assert refused.value.limit == 2 and refused.value.wanted == 3
    assert [v.stream_id for v in registry.views()] == ["one", "two"]
    assert registry.rejected == 2
    registry.apply([three])  # a smaller set is fine, as is growing back up to the limit
    registry.add(one)
    assert sorted(v.stream_id for v in registry.views()) == ["one", "three"]
    with pytest.raises(ValueError, match="max_streams"):
        StreamRegistry(no_runs, max_streams=0)


# -- the number of event viewers --------------------------------------------------------


async def test_event_viewers_are_capped_per_stream_and_in_total(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    limits = {"max_streams": 3, "sse_max_viewers_per_stream": 1, "sse_max_viewers": 2}
    async with bounded_service(detector, shared_nats_server.url, **limits) as svc:
        fanout = svc.service.fanout
        for stream_id in ("a", "b", "c"):
            assert (await svc.call("POST", "/api/streams", json_body=stream(stream_id))).status == 201

        async with viewer(svc, "a"):
            per_stream = await svc.call("GET", "/api/streams/a/events")
            assert_error(per_stream, 429, "viewer limit reached: 1 viewers of stream 'a'")
            assert per_stream.body["detail"] == {"limit": 1, "setting": "http.sse_max_viewers_per_stream"}
            async with viewer(svc, "b"):
                assert fanout.viewer_count == 2
                in_total = await svc.call("GET", "/api/streams/c/events")
                assert_error(in_total, 429, "viewer limit reached: 2 viewers in total (http.sse_max_viewers)")
                assert in_total.body["detail"] == {"limit": 2, "setting": "http.sse_max_viewers"}
                assert fanout.rejected == 2
            # b's viewer left: c has room now (the server notices at the next heartbeat).
            await wait_until(lambda: fanout.viewer_count == 1, 5, "b's viewer to be released")
            async with viewer(svc, "c"):
                assert fanout.viewer_count == 2
        await wait_until(lambda: fanout.viewer_count == 0, 5, "every viewer to be released")
        async with viewer(svc, "a"):  # a's slot is free again
            assert fanout.rejected == 2
        # An unknown stream is still a 404, whatever the room.
        assert_error(await svc.call("GET", "/api/streams/nobody/events"), 404, "unknown stream")


# -- the settings -----------------------------------------------------------------------


def test_limit_defaults() -> None:
    http = HttpSettings()
    assert (http.max_streams, http.sse_max_viewers_per_stream, http.sse_max_viewers) == (64, 16, 256)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("max_streams", 0, "greater than or equal to 1"),
        ("max_streams", -5, "greater than or equal to 1"),
        ("max_streams", "lots", "valid integer"),
        ("max_streams", 2.5, "valid integer"),
        ("sse_max_viewers_per_stream", 0, "greater than or equal to 1"),
        ("sse_max_viewers", 0, "greater than or equal to 1"),
        ("sse_max_viewers", None, "valid integer"),
    ],
)
def test_bad_limits_are_config_errors_naming_the_key(tmp_path: Path, key: str, value: Any, needle: str) -> None:
    path = tmp_path / "vidsentry.yaml"
    path.write_text(f"http:\n  {key}: {'null' if value is None else value}\n")
    with pytest.raises(ConfigError, match=f"http.{key}: .*{needle}"):
        load_config(path, environ={})


def test_a_limit_from_the_environment_is_validated_too() -> None:
    assert load_config(environ={"VIDSENTRY_HTTP__MAX_STREAMS": "8"}).http.max_streams == 8
    with pytest.raises(ConfigError, match=r"http\.sse_max_viewers \(VIDSENTRY_HTTP__SSE_MAX_VIEWERS\): "):
        load_config(environ={"VIDSENTRY_HTTP__SSE_MAX_VIEWERS": "0"})


async def test_the_service_takes_its_limits_from_the_config(
    detector: Detector, shared_nats_server: EmbeddedNatsServer
) -> None:
    config = make_config(http={"max_streams": 3, "sse_max_viewers_per_stream": 2, "sse_max_viewers": 5})
    async with live_service(detector, shared_nats_server.url, config=config) as svc:
        registry, fanout = svc.service.registry, svc.service.fanout
        assert (registry.max_streams, fanout.max_viewers_per_stream, fanout.max_viewers) == (3, 2, 5)
