"""Source churn is where leaks live: add and remove a stream through the API 200 times.

The service runs as `vidsentry serve` in its own process, so what is measured is that
process alone, as it is deployed (the pytest process has its own threads and malloc
arenas from every other test). Each cycle adds a stream (the sample clip paced like a live
camera, audio on), waits until a frame went through the detector, deletes it and waits
until its run has ended. After a warm-up nothing may accumulate: asyncio tasks, threads
(Python and native), file descriptors, child processes; RSS grows under 5 %.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from realtime.bus.embedded import EmbeddedNatsServer
from realtime.http.metrics import RENDER_TTL_S
from tests.support.serve_process import ServeProcess, write_config
from tests.support.service import FAST_SUPERVISOR

CYCLES = 200
WARM_UP = 10
RSS_GROWTH_LIMIT = 0.05
SETTLE_S = 15.0  # returns as soon as the tasks are back; the other test worker may be busy


@dataclass(frozen=True)
class Footprint:
    rss_bytes: int
    open_fds: int
    os_threads: int
    python_threads: int
    asyncio_tasks: int
    children: int


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # Field 4 is the parent pid; the command name (field 2) may hold spaces, so split after ')'.
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry))
    return found


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


async def footprint(session: aiohttp.ClientSession, serve: ServeProcess) -> Footprint:
    assert serve.url is not None
    values = await scrape(session, serve.url)
    return Footprint(
        rss_bytes=int(values["process_resident_memory_bytes"]),
        open_fds=int(values["process_open_fds"]),
        os_threads=int(values["vidsentry_os_threads"]),
        python_threads=int(values["vidsentry_python_threads"]),
        asyncio_tasks=int(values["vidsentry_asyncio_tasks"]),
        children=len(children_of(serve.pid)),
    )


async def footprint_ceiling(session: aiohttp.ClientSession, serve: ServeProcess, renders: int = 4) -> Footprint:
    """The most of each figure over a few of the service's metric renders: some tasks come and go
    all the time (the timeline indexer's fetch keeps two alive while it waits, none while it
    indexes), so one render may catch the service with fewer than it normally runs. The service
    renders at most once per RENDER_TTL_S and answers every scrape meanwhile with that render, so
    samples are spaced past it (samples closer together were copies of one render)."""
    taken = []
    for _ in range(renders):
        taken.append(await footprint(session, serve))
        await asyncio.sleep(RENDER_TTL_S + 0.1)
    return Footprint(*(max(getattr(t, f.name) for t in taken) for f in fields(Footprint)))


async def settled_footprint(session: aiohttp.ClientSession, serve: ServeProcess, before: Footprint) -> Footprint:
    """The footprint once the last cycle's own work is done: a stream's end still publishes its last
    events (its utterance's transcript among them) and its reader thread ends, for a moment after its
    run ended. A leak from 200 cycles does not go away in SETTLE_S; a task finishing its publish, or
    a thread its join, does."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        now = await footprint(session, serve)
        settled = (now.asyncio_tasks <= before.asyncio_tasks and now.python_threads <= before.python_threads
                   and now.os_threads <= before.os_threads)
        if settled or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.2)


async def one_cycle(session: aiohttp.ClientSession, url: str, index: int, clip: Path) -> None:
    stream_id = f"churn-{index}"
    body = {"id": stream_id, "url": str(clip), "realtime": True}
    async with session.post(f"{url}/api/streams", json=body) as response:
        assert response.status == 201, await response.text()
    while True:  # until one frame went through the detector
        async with session.get(f"{url}/api/streams/{stream_id}") as response:
            view = await response.json()
        assert view["state"] in ("pending", "connecting", "live"), view
        if view["counters"]["frames_processed"] >= 1:
            break
        await asyncio.sleep(0.01)
    async with session.delete(f"{url}/api/streams/{stream_id}") as response:
        assert response.status == 204, await response.text()
    while True:  # until its run has ended
        if (await scrape(session, url))["vidsentry_stream_runs_active"] == 0:
            break
        await asyncio.sleep(0.01)


@pytest.mark.slow
async def test_add_and_remove_a_stream_200_times_leaks_nothing(
    shared_nats_server: EmbeddedNatsServer, sample_clip: Path, nudenet_model: Path, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "churn.yaml",
        {
            "node": "churn",
            "detector": {"model": str(nudenet_model), "engine": "onnx-cpu", "threads": 1},
            "supervisor": FAST_SUPERVISOR,
            "sources": {"local_dirs": [str(sample_clip.parent)]},  # the clip is added over the API
        },
    )
    serve = ServeProcess(
        "--config", str(config), "--port", "0", "--nats-url", shared_nats_server.url,
        log_dir=tmp_path, env={"VIDSENTRY_LOG_LEVEL": "warning"},
    )
    with serve.start():
        assert serve.url is not None
        async with aiohttp.ClientSession() as session:
            for index in range(WARM_UP):
                await one_cycle(session, serve.url, index, sample_clip)
            before = await footprint_ceiling(session, serve)
            started = time.monotonic()
            for index in range(WARM_UP, WARM_UP + CYCLES):
                await one_cycle(session, serve.url, index, sample_clip)
            elapsed = time.monotonic() - started
            after = await settled_footprint(session, serve, before)
            async with session.get(f"{serve.url}/api/streams") as response:
                listed = (await response.json())["streams"]
            async with session.get(f"{serve.url}/metrics") as response:
                metrics = await response.text()
        assert serve.terminate() == 0, serve.stderr()

    report = {"cycles": CYCLES, "seconds": round(elapsed, 1), "before": asdict(before), "after": asdict(after)}
    print("churn:", json.dumps(report))
    assert listed == []
    assert "churn-" not in metrics  # a deleted stream leaves no series behind
    assert after.asyncio_tasks <= before.asyncio_tasks, report
    assert after.python_threads <= before.python_threads, report
    assert after.os_threads <= before.os_threads, report
    assert after.open_fds <= before.open_fds, report
    assert after.children <= before.children, report
    assert after.rss_bytes <= before.rss_bytes * (1 + RSS_GROWTH_LIMIT), report
    assert "Traceback" not in serve.stderr()
