"""LeasedRuns alone, without NATS: the registry follows the leases and the desired settings, and a
stream given up keeps its lease until its run has ended."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import pytest

from realtime.config import AnyStreamSettings, CameraStreamSettings
from realtime.fleet.desired import DesiredStreams
from realtime.fleet.runs import LeasedRuns
from realtime.leases.keeper import LeaseKeeper
from realtime.streams.registry import StreamRegistry


def camera(stream_id: str, url: str = "rtsp://cam.example/live") -> CameraStreamSettings:
    return CameraStreamSettings(id=stream_id, url=url)


class FakeDesired:
    def __init__(self) -> None:
        self.streams: dict[str, AnyStreamSettings] = {}
        self.refused: set[str] = set()

    def ids(self) -> list[str]:
        return list(self.streams)

    def settings(self, stream_id: str) -> AnyStreamSettings | None:
        return self.streams.get(stream_id)

    def refusal(self, stream_id: str) -> str | None:
        return "not allowed here" if stream_id in self.refused else None


class FakeKeeper:
    def __init__(self, *held: str) -> None:
        self.leases = set(held)
        self.released: list[str] = []

    def held(self) -> list[str]:
        return sorted(self.leases)

    async def release(self, stream_id: str) -> None:
        self.leases.discard(stream_id)
        self.released.append(stream_id)


def runs_with(keeper: FakeKeeper, desired: FakeDesired, max_streams: int = 8) -> tuple[LeasedRuns, StreamRegistry]:
    registry = StreamRegistry(lambda settings: None, max_streams=max_streams)  # type: ignore[arg-type, return-value]
    runs = LeasedRuns(registry, cast(DesiredStreams, desired), lambda: cast(LeaseKeeper, keeper))
    return runs, registry


def test_the_registry_runs_what_is_held_with_the_desired_settings() -> None:
    desired, keeper = FakeDesired(), FakeKeeper("a")
    desired.streams = {"a": camera("a"), "b": camera("b")}
    runs, registry = runs_with(keeper, desired)
    runs.sync()
    assert set(runs.started) == {"a"} and "a" in registry and "b" not in registry
    # Changed in the fleet: removed and added again with the new settings.
    desired.streams["a"] = camera("a", "rtsp://cam.example/other")
    runs.sync()
    assert registry.get("a").settings == desired.streams["a"] and runs.started["a"] == desired.streams["a"]
    # The lease is gone (expired, taken): the run stops and nothing is handed back.
    keeper.leases.clear()
    runs.sync()
    assert runs.started == {} and "a" not in registry and runs.handing_back == set()


def test_a_stream_given_up_keeps_its_lease_until_its_run_has_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    desired, keeper = FakeDesired(), FakeKeeper("a")
    desired.streams = {"a": camera("a")}
    runs, registry = runs_with(keeper, desired)
    runs.sync()
    running = {"a"}
    monkeypatch.setattr(registry, "active", lambda stream_id: stream_id in running)
    del desired.streams["a"]  # deleted from the fleet
    runs.sync()
    assert runs.handing_back == {"a"} and "a" not in registry
    asyncio.run(runs.release_ended(cast(LeaseKeeper, keeper)))
    assert keeper.released == []
    running.clear()
    asyncio.run(runs.release_ended(cast(LeaseKeeper, keeper)))
    assert keeper.released == ["a"] and runs.handing_back == set()


def test_a_stream_this_worker_cannot_run_is_handed_back(caplog: pytest.LogCaptureFixture) -> None:
    desired, keeper = FakeDesired(), FakeKeeper("a", "b", "c")
    desired.streams = {sid: camera(sid) for sid in ("a", "b", "c")}
    desired.refused = {"c"}
    runs, registry = runs_with(keeper, desired, max_streams=1)
    with caplog.at_level(logging.WARNING, logger="realtime.fleet.worker"):
        runs.sync()
    # One of a and b fits the registry; the other, and c, which this worker's policy refuses, go back.
    (running,) = runs.started
    assert running in registry and runs.handing_back == {"a", "b", "c"} - {running} and "c" not in registry
    messages = [r.getMessage() for r in caplog.records if r.name == "realtime.fleet.worker"]
    assert messages == ["cannot run a claimed stream; handing it back"]
