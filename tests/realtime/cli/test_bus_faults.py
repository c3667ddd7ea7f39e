"""`run` and `serve` against a broker that is down, misconfigured or already has streams: real
nats-server processes, the CLI as a subprocess, exit codes and what the operator reads."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import StreamConfig

from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import STREAM_NAME, desired_config
from tests.realtime.bus.jetstream_log import stored_events
from tests.support.cli import vidsentry
from tests.support.nats import stored_bodies
from tests.support.serve_process import ServeProcess, http, write_config
from tests.support.service import FAST_SUPERVISOR
from tests.support.waiting import poll

pytestmark = pytest.mark.timeout(180)


def error_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The one `vidsentry: error:` line of a failed command, with no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("vidsentry: error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


async def _add_stream(url: str, config: StreamConfig) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(config)
    finally:
        await nc.close()


def add_stream(url: str, config: StreamConfig) -> None:
    asyncio.run(_add_stream(url, config))


async def _stored_messages(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info(STREAM_NAME)).state.messages)
    finally:
        await nc.close()


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    with EmbeddedNatsServer(store_dir=tmp_path / "nats-store") as server:
        yield server


def run_clip(clip: Path, model: Path, nats_url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return vidsentry(
        "run", str(clip), "--id", "lobby", "--model", str(model), "--engine", "onnx-cpu", "--realtime",
        "--nats-url", nats_url, *extra,
    )  # fmt: skip


# -- item 7: events the broker refuses ------------------------------------------------------------


def test_run_counts_events_the_broker_refuses_before_its_summary_and_exits_1(
    fresh_nats: EmbeddedNatsServer, sample_clip: Path, nudenet_model: Path
) -> None:
    # A stream that takes no message over 300 bytes: JetStream refuses every durable event.
    small = desired_config(7 * 24 * 3600)
    small.max_msg_size = 300
    add_stream(fresh_nats.url, small)

    proc = run_clip(sample_clip, nudenet_model, fresh_nats.url, "--duration", "3", "--json")
    line = error_line(proc, 1)
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert asyncio.run(_stored_messages(fresh_nats.url)) == 0
    assert summary["events_acked"] == 0
    assert summary["events_lost"] >= 3  # connecting, live, stopped at least
    assert summary["events_unconfirmed"] == 0  # refusals come back as refusals, not as silence
    assert f"{summary['events_lost']} durable events were not stored" in line
    assert "message size exceeds maximum" in line
    assert f"failed {summary['events_failed']}" in proc.stderr  # the printed summary counts them


def test_a_server_whose_max_payload_cannot_carry_the_stream_setup_is_one_line(
    tmp_path: Path, sample_clip: Path, nudenet_model: Path
) -> None:
    config = tmp_path / "small.conf"
    config.write_text("max_payload: 300\n")
    with EmbeddedNatsServer(store_dir=tmp_path / "store", config_file=config) as server:
        line = error_line(run_clip(sample_clip, nudenet_model, server.url, "--duration", "1"), 1)
    assert "max_payload" in line and "300" in line


# -- item 6: streams that exist already -------------------------------------------------------------


def test_run_uses_a_vidsentry_stream_that_already_covers_its_subjects(
    fresh_nats: EmbeddedNatsServer, sample_clip: Path, nudenet_model: Path
) -> None:
    add_stream(fresh_nats.url, StreamConfig(name=STREAM_NAME, subjects=["vidsentry.>"], duplicate_window=120))
    proc = run_clip(sample_clip, nudenet_model, fresh_nats.url, "--duration", "2")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert asyncio.run(_stored_messages(fresh_nats.url)) > 0


def test_run_and_serve_name_another_stream_that_owns_the_subjects_and_exit_2(
    fresh_nats: EmbeddedNatsServer, sample_clip: Path, nudenet_model: Path, tmp_path: Path
) -> None:
    add_stream(fresh_nats.url, StreamConfig(name="EVENTS", subjects=["vidsentry.>"]))
    line = error_line(run_clip(sample_clip, nudenet_model, fresh_nats.url, "--duration", "1"), 2)
    assert "EVENTS" in line and "vidsentry.>" in line and "remove" in line

    config = write_config(tmp_path / "serve.yaml", {"detector": {"model": str(nudenet_model), "engine": "onnx-cpu"}})
    proc = vidsentry("serve", "--config", str(config), "--port", "0", "--nats-url", fresh_nats.url, timeout=60)
    line = error_line(proc, 2)
    assert "EVENTS" in line and "vidsentry.>" in line


# -- item 5: SIGTERM while NATS is down, with an outbox ----------------------------------------------

SHUTDOWN_BUDGET_S = 20.0


def outbox_events(url: str | None) -> float:
    text = http("GET", f"{url}/metrics")[1]
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith("vidsentry_outbox_events "))


def test_sigterm_with_nats_down_keeps_events_in_the_outbox_and_does_not_wait_for_nats(
    sample_clip: Path, nudenet_model: Path, tmp_path: Path
) -> None:
    outbox = tmp_path / "outbox"

    def config(name: str, streams: list[dict[str, Any]]) -> str:
        settings = {
            "detector": {"model": str(nudenet_model), "engine": "onnx-cpu", "threads": 1},
            "supervisor": FAST_SUPERVISOR,
            "nats": {"outbox_dir": str(outbox)},
            "http": {"shutdown_timeout_s": SHUTDOWN_BUDGET_S},
            "streams": streams,
        }
        return str(write_config(tmp_path / name, settings))

    camera = {"id": "lobby", "url": str(sample_clip), "realtime": True}
    unreachable = {"id": "gate", "url": "rtsp://127.0.0.1:1/cam"}  # its retries keep publishing status events
    with EmbeddedNatsServer(store_dir=tmp_path / "nats-store") as server:
        first_logs = tmp_path / "first"
        first_logs.mkdir()
        serve = ServeProcess(
            "--config", config("with-cameras.yaml", [camera, unreachable]), "--port", "0", "--nats-url", server.url,
            log_dir=first_logs,
        )  # fmt: skip
        with serve.start():
            poll(lambda: http("GET", f"{serve.url}/readyz")[0] == 200, 30, "/readyz to say ready")
            assert "outbox" in http("GET", f"{serve.url}/readyz")[1]["checks"]
            processed = lambda: http("GET", f"{serve.url}/api/streams/lobby")[1]["counters"]["frames_processed"]  # noqa: E731
            poll(lambda: processed() >= 3, 60, "frames processed")
            server.kill()
            poll(lambda: http("GET", f"{serve.url}/readyz")[1]["detail"]["checks"]["nats"] is False, 30, "NATS down")
            poll(lambda: outbox_events(serve.url) >= 3, 30, "events to wait in the outbox")
            asked = time.monotonic()
            code = serve.terminate(timeout=SHUTDOWN_BUDGET_S + 30)
            took = time.monotonic() - asked
        assert code == 0, serve.stderr()
        # A bound, not a benchmark: nothing can flush, so it must not sit out the shutdown budget.
        assert took < SHUTDOWN_BUDGET_S / 2, (took, serve.stderr()[-3000:])
        wait_line = "durable events wait in the outbox for the next start"
        waiting = next(r for r in serve.log_records() if r["msg"] == wait_line)
        spooled = waiting["outbox_events"]
        assert spooled >= 1 and waiting["outbox_dir"] == str(outbox)

        # The next start, with NATS back, sends them: exactly once.
        server.restart()
        second_logs = tmp_path / "second"
        second_logs.mkdir()
        again = ServeProcess(
            "--config", config("no-camera.yaml", []), "--port", "0", "--nats-url", server.url, log_dir=second_logs
        )
        with again.start():
            poll(lambda: outbox_events(again.url) == 0, 30, "the outbox to be replayed")
            assert again.terminate() == 0, again.stderr()
        stopped = next(r for r in again.log_records() if r["msg"] == "service stopped")
        assert sum(kind["acked"] for kind in stopped["events"].values()) == spooled

        ids = Counter(stored.event_id for stored in asyncio.run(stored_events(server.url)))
        assert ids and max(ids.values()) == 1, ids.most_common(3)
        states = [s["state"] for s in stored_bodies(server.url, "vidsentry.lobby.status")]
        assert states.count("stopped") == 1 and states[0] == "connecting", states
