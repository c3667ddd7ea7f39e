"""The reconciler on its own: real StreamRunners, a list for a sink, no HTTP."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engines.detector import Detector
from pipelines.detect import DetectionBatcher
from pipelines.frames import StreamState
from pipelines.graph import SharedEngines
from realtime.config import CameraStreamSettings
from realtime.sources.supervisor import SupervisorPolicy
from realtime.streams.registry import RegistryClosed, RestartPolicy, StreamExists, StreamRegistry, UnknownStream
from realtime.streams.runner import StreamRunner
from realtime.streams.spec import stream_spec
from tests.support.sinks import ListSink
from tests.support.waiting import wait_until

REFUSED = "rtsp://127.0.0.1:1/cam"  # connection refused at once



class HeldRunner(StreamRunner):
    """A runner whose run only returns once the test lets it (a slow camera shutdown)."""

    def __init__(self, *args: object, let_go: asyncio.Event, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.let_go = let_go

    async def run(self) -> StreamState:
        state = await super().run()
        await self.let_go.wait()
        return state


@dataclass
class Factory:
    batcher: DetectionBatcher
    sink: ListSink = field(default_factory=ListSink)
    policy: SupervisorPolicy = field(default_factory=lambda: SupervisorPolicy(backoff_initial=0.2, backoff_max=0.5))
    hold: asyncio.Event | None = None
    built: list[StreamRunner] = field(default_factory=list)
    fail_next: int = 0

    def __call__(self, settings: CameraStreamSettings) -> StreamRunner:
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("cannot build this one")
        spec = stream_spec(settings, policy=self.policy)
        runner: StreamRunner
        if self.hold is not None:
            runner = HeldRunner(spec, SharedEngines(self.batcher), self.sink, let_go=self.hold)
        else:
            runner = StreamRunner(spec, SharedEngines(self.batcher), self.sink)
        self.built.append(runner)
        return runner


@pytest.fixture
async def batcher(detector: Detector) -> AsyncIterator[DetectionBatcher]:
    async with DetectionBatcher(detector) as batcher:
        yield batcher


@contextlib.asynccontextmanager
async def reconciling(registry: StreamRegistry) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(registry.run())
    try:
        yield task
    finally:
        registry.close()
        await asyncio.wait_for(task, 15)


def stream(stream_id: str, url: str = REFUSED, **extra: object) -> CameraStreamSettings:
    return CameraStreamSettings.model_validate({"id": stream_id, "url": url, "audio": False, **extra})


async def test_a_re_added_id_waits_for_its_previous_run_to_stop(batcher: DetectionBatcher) -> None:
    hold = asyncio.Event()
    factory = Factory(batcher, hold=hold)
    registry = StreamRegistry(factory)
    async with reconciling(registry):
        registry.add(stream("cam"))
        await wait_until(lambda: registry.running_count == 1, 5, "the first run")
        registry.remove("cam")
        await wait_until(lambda: factory.built[0].state is StreamState.STOPPED, 5, "the first run to stop")
        registry.add(stream("cam"))
        await asyncio.sleep(0.2)
        view = registry.get("cam")
        assert view.state == "pending" and "previous run" in (view.reason or "")
        assert len(factory.built) == 1  # never two runs of one id
        hold.set()
        await wait_until(lambda: len(factory.built) == 2, 5, "the second run")
        assert registry.get("cam").state in ("connecting", "reconnecting")


async def test_apply_keeps_unchanged_streams_and_replaces_changed_ones(batcher: DetectionBatcher) -> None:
    factory = Factory(batcher)
    registry = StreamRegistry(factory)
    async with reconciling(registry):
        registry.apply([stream("a"), stream("b"), stream("c")])
        await wait_until(lambda: registry.running_count == 3, 5, "three runs")
        first = {r.stream_id: r for r in factory.built}
        registry.apply([stream("a"), stream("b", detect_fps=2)])  # b changed, c gone
        await wait_until(lambda: len(factory.built) == 4, 5, "b to be restarted")
        await wait_until(lambda: registry.running_count == 2, 5, "c to stop")
        assert [v.stream_id for v in registry.views()] == ["a", "b"]
        assert first["a"].state is not StreamState.STOPPED  # untouched
        assert first["b"].state is StreamState.STOPPED and first["c"].state is StreamState.STOPPED
        with pytest.raises(StreamExists):
            registry.add(stream("a"))
        with pytest.raises(UnknownStream):
            registry.remove("c")
    with pytest.raises(RegistryClosed):
        registry.add(stream("d"))
    assert all(r.state is StreamState.STOPPED for r in factory.built)


async def test_a_camera_that_ends_by_itself_is_restarted_with_back_off(batcher: DetectionBatcher) -> None:
    # A supervisor that gives up after one refused connect stands in for any run ending by itself.
    factory = Factory(batcher, policy=SupervisorPolicy(backoff_initial=0.1, max_failed_connects=1))
    registry = StreamRegistry(factory, restart=RestartPolicy(initial_s=0.1, max_s=0.2))
    async with reconciling(registry):
        registry.add(stream("flaky"))
        await wait_until(lambda: registry.get("flaky").restarts >= 2, 10, "two restarts")
        assert factory.built[0].state is StreamState.FAILED


async def test_a_bad_file_fails_once_and_stays_failed(batcher: DetectionBatcher, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"\x00not a video\x00" * 10_000)
    factory = Factory(batcher)
    registry = StreamRegistry(factory, restart=RestartPolicy(initial_s=0.05))
    async with reconciling(registry):
        registry.add(stream("bad", str(garbage)))
        await wait_until(lambda: registry.get("bad").state == "failed", 10, "the file to fail")
        await asyncio.sleep(0.3)
        view = registry.get("bad")
        assert len(factory.built) == 1 and view.restarts == 0 and view.restart_in is None
        assert view.reason


async def test_a_runner_that_cannot_be_built_fails_the_stream_only(batcher: DetectionBatcher) -> None:
    factory = Factory(batcher, fail_next=1)
    registry = StreamRegistry(factory, restart=RestartPolicy(initial_s=0.1))
    async with reconciling(registry):
        registry.add(stream("first"))
        registry.add(stream("second"))
        await wait_until(lambda: len(factory.built) == 2, 5, "a retry and the other stream")
        assert {r.stream_id for r in factory.built} == {"first", "second"}


async def test_the_owner_hears_once_an_id_is_neither_wanted_nor_running(
    batcher: DetectionBatcher, tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"\x00not a video\x00" * 10_000)
    gone: list[str] = []
    registry = StreamRegistry(Factory(batcher), on_gone=gone.append)
    async with reconciling(registry):
        registry.add(stream("ended", str(garbage)))
        registry.add(stream("live"))
        await wait_until(lambda: registry.get("ended").state == "failed", 10, "the file to fail")
        registry.remove("ended")  # not running any more: gone at once
        assert gone == ["ended"]
        registry.remove("live")  # gone once its run has ended
        assert gone == ["ended"]
        await wait_until(lambda: gone == ["ended", "live"], 5, "the live one to be gone")
