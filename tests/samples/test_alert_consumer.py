"""samples/alert_consumer.py against a real JetStream: durable, acks, clean shutdown."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import sys
from pathlib import Path

import nats
import pytest

from pipelines.events import Event, EventKind
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.publisher import NatsEventPublisher
from tests.support.bodies import any_event
from tests.support.nats import fetches_time_out_between_pulls

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "samples" / "alert_consumer.py"


def alert(stream_id: str, rule: str) -> Event:
    return any_event(EventKind.ALERTS, stream_id, {"rule": rule, "event": "start"})


async def publish(url: str, *events: Event) -> None:
    async with NatsEventPublisher(url, node="test") as publisher:
        for event in events:
            await publisher.publish(event)
        assert await publisher.flush(10)


async def consumer(url: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), "--nats-url", url, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def run_consumer(url: str, *args: str) -> tuple[int, list[dict[str, object]], str]:
    proc = await consumer(url, *args)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, [json.loads(line) for line in stdout.decode().splitlines()], stderr.decode()


async def test_alerts_are_delivered_once_acked_and_resumed_after_a_restart(nats_server: EmbeddedNatsServer) -> None:
    first, second = alert("gate", "loitering"), alert("dock", "fall")
    await publish(nats_server.url, first)
    code, lines, stderr = await run_consumer(nats_server.url, "--from-start", "--count", "1")
    assert code == 0, stderr
    assert [line["id"] for line in lines] == [first.id]
    assert lines[0]["subject"] == "vidsentry.gate.alerts" and lines[0]["data"]["rule"] == "loitering"  # type: ignore[index]

    # Raised while the consumer is down: delivered when it comes back, and only that one.
    await publish(nats_server.url, second)
    code, lines, stderr = await run_consumer(nats_server.url, "--count", "1")
    assert code == 0, stderr
    assert [line["id"] for line in lines] == [second.id]
    nc = await nats.connect(nats_server.url)
    try:
        info = await nc.jetstream().consumer_info("VIDSENTRY", "alert-consumer")
    finally:
        await nc.close()
    assert info.num_ack_pending == 0 and info.num_pending == 0 and info.delivered.stream_seq >= 2


async def test_sigterm_stops_a_waiting_consumer_cleanly(nats_server: EmbeddedNatsServer) -> None:
    await publish(nats_server.url)  # creates the stream
    proc = await consumer(nats_server.url)
    assert proc.stderr is not None
    line = await asyncio.wait_for(proc.stderr.readline(), 20)
    assert b"waiting for alerts" in line
    proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.wait(), 10)
    assert proc.returncode == 0, (await proc.stderr.read()).decode()


async def test_a_fetch_that_times_out_with_asyncio_s_error_is_waited_past(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-py's fetch raises asyncio's TimeoutError, not its own, when its deadline passes between
    its two pulls (a loaded machine): the consumer fetches again instead of exiting "cannot reach"."""
    spec = importlib.util.spec_from_file_location("alert_consumer", SCRIPT)
    assert spec is not None and spec.loader is not None
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    timed_out = fetches_time_out_between_pulls(monkeypatch, 1)
    raised = alert("gate", "loitering")
    await publish(nats_server.url, raised)
    handled = await asyncio.wait_for(
        sample.consume(nats_server.url, "in-process", from_start=True, count=1, stop=asyncio.Event()), 30)
    assert handled == 1 and timed_out == [1]
