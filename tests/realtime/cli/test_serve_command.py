"""`vidsentry serve` as a user runs it: a subprocess with the sample config, stopped by SIGTERM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.nats import stored_bodies
from tests.support.serve_process import ROOT, ServeProcess, http, write_config
from tests.support.service import FAST_SUPERVISOR
from tests.support.waiting import poll


def usage_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The one-line reason of an exit-2 failure."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("vidsentry: error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def serve_once(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("VIDSENTRY_")}
    return subprocess.run(
        [sys.executable, "-m", "realtime.cli", "serve", *args],
        cwd=ROOT,
        env={**environment, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_sample_config_serves_then_sigterm_keeps_every_durable_event(
    nats_server: EmbeddedNatsServer, sample_clip: Path, tmp_path: Path
) -> None:
    serve = ServeProcess(
        "--config", "samples/vidsentry.yaml", "--port", "0", "--nats-url", nats_server.url, log_dir=tmp_path
    )
    with serve.start():
        assert serve.url is not None and serve.url.startswith("http://127.0.0.1:")
        poll(lambda: http("GET", f"{serve.url}/readyz")[0] == 200, 30, "/readyz to say ready")
        # Started as a program, serve runs again on jemalloc (deploy/setup.sh installs it).
        assert "libjemalloc" in Path(f"/proc/{serve.pid}/maps").read_text()
        # The sample's stream plays the sample clip like a camera; let tracks open.
        poll(lambda: http("GET", f"{serve.url}/api/streams/plaza")[1]["counters"]["tracks"] >= 2, 60, "tracks")
        assert serve.terminate() == 0, serve.stderr()

    records = serve.log_records()
    messages = [r["msg"] for r in records]
    assert "service listening" in messages and "draining: stopping streams" in messages
    stopped = next(r for r in records if r["msg"] == "service stopped")
    assert stopped["flushed"] is True
    published = stopped["events"]

    tracks = stored_bodies(nats_server.url, "vidsentry.plaza.tracks")
    statuses = stored_bodies(nats_server.url, "vidsentry.plaza.status")
    # Every durable event the service published is in JetStream, none failed.
    for kind, stored in (("tracks", tracks), ("status", statuses)):
        assert published[kind]["failed"] == 0, published
        assert published[kind]["acked"] == published[kind]["published"] == len(stored), (kind, published)
    assert [s["state"] for s in statuses] == ["connecting", "live", "stopped"]
    opened = {t["track_id"] for t in tracks if t["event"] == "new"}
    ended = {t["track_id"]: t for t in tracks if t["event"] == "end"}
    assert len(opened) >= 2 and opened <= set(ended), (opened, set(ended))
    assert any(t["reason"] == "stream_stopped" for t in ended.values())


def test_token_from_the_environment_protects_a_public_bind_and_the_outbox_is_used(
    shared_nats_server: EmbeddedNatsServer, nudenet_model: Path, tmp_path: Path
) -> None:
    outbox = tmp_path / "outbox"
    config = write_config(
        tmp_path / "public.yaml",
        {
            "detector": {"model": str(nudenet_model), "engine": "onnx-cpu", "threads": 1},
            "supervisor": FAST_SUPERVISOR,
            "nats": {"outbox_dir": str(outbox)},
        },
    )
    token = "tok-" + "x" * 28
    serve = ServeProcess(
        "--config", str(config), "--host", "0.0.0.0", "--port", "0", "--nats-url", shared_nats_server.url,
        log_dir=tmp_path, env={"VIDSENTRY_API_TOKEN": token + "\n"},
    )
    with serve.start():
        assert serve.url is not None
        local = serve.url.replace("0.0.0.0", "127.0.0.1")
        assert http("GET", f"{local}/api/streams")[0] == 401
        assert http("GET", f"{local}/api/streams", token=token) == (200, {"streams": []})
        assert http("GET", f"{local}/healthz")[0] == 200
        metrics = http("GET", f"{local}/metrics")[1]
        assert "vidsentry_outbox_events 0.0" in metrics and "vidsentry_outbox_bytes" in metrics
        assert (outbox / "LOCK").exists()  # the configured outbox is in use
        assert serve.terminate() == 0, serve.stderr()
    assert token not in serve.stderr()


def test_a_public_bind_without_a_token_is_refused() -> None:
    proc = serve_once("--host", "0.0.0.0", "--port", "0")
    line = usage_error(proc)
    assert "0.0.0.0" in line and "VIDSENTRY_API_TOKEN" in line and "--allow-unauthenticated" in line


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    # Each case costs a process start; the keys themselves are covered in-process (test_listen_rules.py).
    cases = [
        ("http:\n  prot: 8080\n", {}, "http.prot: unknown key"),
        ("streams:\n  - id: a\n    url: ftp://cam/1\n", {}, "streams.0.url"),
        ("", {"VIDSENTRY_HTTP__SSE_HEARTBEAT_S": "-1"}, "http.sse_heartbeat_s"),
    ]
    for index, (text, env, needle) in enumerate(cases):
        path = tmp_path / f"bad{index}.yaml"
        path.write_text(text)
        line = usage_error(serve_once("--config", str(path), env=env))
        assert needle in line and str(path) in line, (needle, line)
    line = usage_error(serve_once("--config", str(tmp_path / "missing.yaml")))
    assert "not found" in line


def test_a_port_in_use_is_a_runtime_error(
    shared_nats_server: EmbeddedNatsServer, nudenet_model: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "c.yaml", {"detector": {"model": str(nudenet_model), "engine": "onnx-cpu"}})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = serve_once("--config", str(config), "--port", str(port), "--nats-url", shared_nats_server.url)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "Traceback" not in proc.stderr


def test_config_streams_asking_captions_the_service_cannot_serve_exit_2_naming_each(
    nudenet_model: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "own.yaml", {
        "detector": {"model": str(nudenet_model), "engine": "onnx-cpu", "threads": 1},
        "captions": {"max_models": 1},
        "streams": [
            {"id": "a", "url": "rtsp://127.0.0.1:9/x", "captions": {"model": "base", "language": "es"}},
            {"id": "b", "url": "rtsp://127.0.0.1:9/x", "captions": {"translate": "en"}},
        ],
    })
    line = usage_error(serve_once("--config", str(config), "--port", "0"))
    assert "streams.0.captions: captions.max_models is 1 and tiny.en is loaded; model base would be one more" in line
    assert "streams.1.captions: translate needs a multilingual model" in line
