"""Scene descriptions through the running service, with the vLLM simulator as the VLM (a real
HTTP server with vLLM's API, errors and prefix cache): descriptions on NATS and over SSE, a
`vlm` rule's alert, an outage and recovery, a stream deleted while its request is in flight,
and the `vlm:` config section."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from engines.detector import Detector
from engines.vlm.client import VlmClient, VlmSettings, create_vlm_client
from pipelines.describe.capability import CAPABILITY as DESCRIBER
from pipelines.describe.capability import open_describer
from pipelines.describe.config import VlmConfig
from pipelines.describe.settings import DescribeEngine, DescribeSettings
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.cli.bootstrap import with_flag
from realtime.config import Config, ConfigError, load_config
from realtime.config_checks import config_rule_problems
from tests.support.cli import one_error_line, vidsentry
from tests.support.service import LiveService, live_service, make_config
from tests.support.sse import read_sse
from tests.support.vllm_sim import VllmSimulator
from tests.support.waiting import eventually, wait_until

pytestmark = pytest.mark.slow

SETTINGS = DescribeSettings(min_interval_s=0.5, max_interval_s=1.0, describe_interval_s=1.0, max_frames=8)


class Described:
    """Every event of a kind on NATS for one stream."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def start(self, url: str, subject: str) -> nats.NATS:
        nc = await nats.connect(url)

        async def on_message(msg: Any) -> None:
            self.bodies.append(json.loads(msg.data))

        await nc.subscribe(subject, cb=on_message)
        return nc


@pytest.fixture
async def sim() -> AsyncIterator[VllmSimulator]:
    async with VllmSimulator(latency_s=0.05, limit_images=8) as server:
        yield server


@pytest.fixture
async def vlm(sim: VllmSimulator) -> AsyncIterator[VlmClient]:
    client = create_vlm_client(
        VlmSettings(endpoints=(sim.url,), model=sim.model, breaker_failures=2, breaker_reset_s=0.5, max_retries=0)
    )
    yield client
    await client.aclose()


@pytest.fixture
async def svc(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, sim: VllmSimulator, vlm: VlmClient
) -> AsyncIterator[LiveService]:
    engine = DescribeEngine(vlm, sim.model, SETTINGS)
    async with live_service(detector, shared_nats_server.url, config=make_config(), describe=engine) as live:
        yield live


def clip(vtest_avi: Path, stream_id: str, **extra: Any) -> dict[str, Any]:
    return {"id": stream_id, "url": str(vtest_avi), "audio": False, "detect_fps": 2, **extra}


def sse_descriptions(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in seen if e["event"] == "descriptions"]


def epoch_followers(descriptions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The descriptions after the first of the first epoch that has two or more of them ([] if none)."""
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for d in descriptions:
        by_epoch.setdefault(d["epoch"], []).append(d)
    return next((ds[1:] for ds in by_epoch.values() if len(ds) >= 3), [])


async def test_descriptions_reach_nats_and_sse_with_the_prefix_cached(
    svc: LiveService, sim: VllmSimulator, vtest_avi: Path, shared_nats_server: EmbeddedNatsServer
) -> None:
    described = Described()
    nc = await described.start(shared_nats_server.url, "vidsentry.scene.descriptions")
    seen: list[dict[str, Any]] = []
    try:
        assert (await svc.call("POST", "/api/streams", json_body=clip(vtest_avi, "scene"))).status == 201
        async with svc.session.get(svc.url + "/api/streams/scene/events") as response:
            reader = asyncio.create_task(read_sse(response, seen))
            # The prefix cache is for the descriptions of an epoch after its first: however the
            # descriptions fall into epochs on this machine, wait until one has two of those.
            await wait_until(
                lambda: len(sse_descriptions(seen)) >= 4 and bool(epoch_followers(sse_descriptions(seen))), 30,
                "descriptions on SSE, two after the first of an epoch",
            )
            reader.cancel()
        await wait_until(lambda: len(described.bodies) >= 4, 10, "descriptions on NATS")
        stream = await svc.stream("scene")
        assert stream["state"] == "live"
        counters = stream["counters"]
    finally:
        await nc.close()
    data = described.bodies[-1]
    assert set(data) >= {
        "text",
        "fields",
        "window_start_pts",
        "window_end_pts",
        "frames",
        "epoch",
        "prompt_tokens",
        "cached_tokens",
        "latency_ms",
        "model",
    }
    assert data["model"] == sim.model and data["text"] and data["frames"] >= 1
    assert data["window_start_pts"] <= data["window_end_pts"]
    sse = sse_descriptions(seen)
    assert sse[0]["text"] == "A person walks across an empty parking lot."
    cached = [d for d in epoch_followers(sse) if d["cached_tokens"]]
    assert cached and max(d["cached_tokens"] / d["prompt_tokens"] for d in cached) >= 0.7
    assert counters["descriptions"] >= 4 and counters["describe_frames"] >= 4
    assert counters["frames_processed"] > 0  # detection runs beside it
    metrics = (await svc.call("GET", "/metrics")).body
    assert "vidsentry_stream_descriptions_total" in metrics
    tokens = re.search(r'^vidsentry_vlm_tokens_total\{kind="cached"\} ([0-9.e+]+)$', metrics, re.M)
    assert tokens and float(tokens.group(1)) > 0 and "vidsentry_vlm_requests_total" in metrics
    latest = (await svc.call("GET", "/api/streams/scene/description")).body["description"]
    assert latest["text"] and latest["epoch"] >= 1 and latest["captured_at"] > 0
    assert (await svc.call("GET", "/api/streams/nowhere/description")).status == 404


async def test_a_vlm_rule_raises_an_alert_with_the_models_reason(
    svc: LiveService, sim: VllmSimulator, vtest_avi: Path, shared_nats_server: EmbeddedNatsServer
) -> None:
    def answer(body: dict[str, Any]) -> str:
        if "Question:" in body["messages"][-1]["content"][-1]["text"]:
            return json.dumps({"answer": "yes", "reason": "two people walk past"})
        return json.dumps({"description": "People walk.", "people": 2, "activity": "walking", "unusual": False})

    sim.answer = answer
    alerts = Described()
    nc = await alerts.start(shared_nats_server.url, "vidsentry.asked.alerts")
    rule = {
        "id": "walkers",
        "type": "vlm",
        "question": "Is anyone walking?",
        "cadence_s": 1,
        "for_s": 1,
        "snapshot": True,
    }
    try:
        reply = await svc.call("POST", "/api/streams", json_body=clip(vtest_avi, "asked", rules=[rule]))
        assert reply.status == 201, reply
        await wait_until(lambda: bool(alerts.bodies), 30, "a vlm alert")
        assert (await svc.call("DELETE", "/api/streams/asked")).status == 204
        await wait_until(lambda: len(alerts.bodies) >= 2, 15, "its end")
    finally:
        await nc.close()
    start, end = alerts.bodies[:2]
    assert start["event"] == "start" and start["rule_type"] == "vlm"
    assert start["evidence"]["reason"] == "two people walk past"
    assert start["snapshot"], "the frame the describer encoded, stored"
    assert end["event"] == "end" and end["alert_id"] == start["alert_id"]


async def test_an_outage_pauses_descriptions_and_the_stream_goes_on(
    svc: LiveService, sim: VllmSimulator, vtest_avi: Path
) -> None:
    assert (await svc.call("POST", "/api/streams", json_body=clip(vtest_avi, "outage"))).status == 201

    async def counters() -> dict[str, float]:
        return dict((await svc.stream("outage"))["counters"])

    async def reaches(key: str, value: float, within_s: float) -> dict[str, float]:
        deadline = asyncio.get_running_loop().time() + within_s
        while (now := await counters())[key] < value:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{key} never reached {value}: {now}")
            await asyncio.sleep(0.1)
        return now

    await reaches("descriptions", 2, 30)
    sim.down = True
    down = await reaches("vlm_unavailable", 2, 20)

    async def circuit_open() -> bool:
        metrics = (await svc.call("GET", "/metrics")).body
        return f'vidsentry_vlm_endpoint_open{{endpoint="{sim.url}"}} 1.0' in metrics

    await eventually(circuit_open, 20, "the VLM endpoint's circuit to open")
    # Detection never waits for the VLM: frames go on being processed while it is down ...
    during = await reaches("frames_processed", down["frames_processed"] + 4, 20)
    assert during["descriptions"] <= down["descriptions"] + 1  # ... and at most one was already on its way
    assert (await svc.stream("outage"))["state"] == "live"
    sim.down = False
    await reaches("descriptions", during["descriptions"] + 2, 20)


async def test_a_stream_deleted_while_its_request_is_in_flight_leaves_nothing(
    svc: LiveService, sim: VllmSimulator, vlm: VlmClient, vtest_avi: Path
) -> None:
    sim.latency_s = 30.0
    assert (await svc.call("POST", "/api/streams", json_body=clip(vtest_avi, "gone"))).status == 201
    await wait_until(lambda: sim.in_flight == 1, 20, "a request in flight")
    assert (await svc.call("DELETE", "/api/streams/gone")).status == 204
    await wait_until(lambda: sim.in_flight == 0, 10, "the request to be aborted")
    await wait_until(lambda: svc.service.registry.running_count == 0, 10, "the stream to end")
    assert vlm.stats().in_flight == 0 and sim.disconnects >= 1
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("gone-")]
    assert (await svc.call("GET", "/api/streams/gone")).status == 404


def test_the_vlm_config_section(tmp_path: Path) -> None:
    config = Config.model_validate(
        {
            "vlm": {
                "endpoints": ["http://vllm:8000/v1", "http://vllm-2:8000/v1"],
                "cache_salt": "tenant-salt",
                "frame_width": 504,
                "frame_height": 280,
                "max_frames": 16,
                "api_key_env": "MY_VLLM_KEY",
            }
        }
    )
    vlm = config.vlm
    assert vlm.enabled and not Config().vlm.enabled
    client = vlm.client_settings({"MY_VLLM_KEY": "secret"})
    assert client.endpoints == ("http://vllm:8000/v1", "http://vllm-2:8000/v1") and client.api_key == "secret"
    assert "secret" not in repr(client) and "tenant-salt" not in repr(vlm)
    settings = vlm.describe_settings()
    assert settings.frame_size == (504, 280) and settings.max_frames == 16 and settings.cache_salt == "tenant-salt"
    assert "tenant-salt" not in repr(settings)
    path = tmp_path / "c.yaml"
    for bad, key in [
        ("vlm: {endpoints: ['vllm:8000']}", "vlm.endpoints"),
        ("vlm: {endpoints: ['http://u:p@vllm:8000/v1']}", "vlm.endpoints"),
        ("vlm: {min_interval_s: 20, max_interval_s: 5}", "vlm"),
        ("vlm: {api_key_env: 'not a name'}", "vlm.api_key_env"),
        ("vlm: {frames: 3}", "vlm.frames"),
    ]:
        path.write_text(bad)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(path, environ={})
    env = load_config(None, environ={"VIDSENTRY_VLM__ENDPOINTS": "[http://vllm:8000/v1]"})
    assert env.vlm.endpoints == ["http://vllm:8000/v1"]
    stream = make_config(
        streams=[
            {
                "id": "c",
                "url": "rtsp://cam.example/live",
                "describe": False,
                "rules": [{"id": "q", "type": "vlm", "question": "Any smoke?"}],
            }
        ]
    )
    assert stream.streams[0].describe is False


async def test_run_with_vlm_url_prints_and_counts_descriptions(vtest_avi: Path) -> None:
    # Not vLLM: a server that takes images only as data URLs and leaves the JSON to the model, which
    # fences it (llama.cpp's server, Ollama, LM Studio). Descriptions must keep coming all the same.
    async with VllmSimulator(images="data", answers="fenced") as server:
        proc = await asyncio.to_thread(
            vidsentry,
            "run",
            str(vtest_avi),
            "--vlm-url",
            server.url,
            "--realtime",
            "--no-audio",
            "--duration",
            "12",
            "--detect-fps",
            "2",
            "--json",
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["descriptions"] >= 2 and summary["vlm_prompt_tokens"] > 0
    assert len(server.requests) >= summary["descriptions"]
    assert "does not take images by uuid" in proc.stderr  # said once, then data URLs


def test_a_bad_vlm_url_is_one_line_and_exit_2(vtest_avi: Path) -> None:
    line = one_error_line(vidsentry("run", str(vtest_avi), "--vlm-url", "vllm:8000"), 2)
    assert "--vlm-url" in line and "http" in line


async def test_without_a_vlm_there_are_no_descriptions_and_the_log_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pipelines.describe.capability")
    async with open_describer(VlmConfig()) as engine:
        assert engine is None
    said = [r.getMessage() for r in caplog.records if "no VLM configured" in r.getMessage()]
    assert len(said) == 1
    url = with_flag(DESCRIBER, DESCRIBER.flags[0], VlmConfig(), "http://127.0.0.1:8000/v1")  # --vlm-url
    assert url.endpoints == ["http://127.0.0.1:8000/v1"] and url.enabled
    async with open_describer(url) as engine:
        assert engine is not None and engine.model == url.model


async def test_without_a_vlm_a_vlm_rule_is_refused_with_a_reason(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, vtest_avi: Path
) -> None:
    rules = [{"id": "door", "type": "present"}, {"id": "smoke", "type": "vlm", "question": "Any smoke?"}]
    async with live_service(detector, shared_nats_server.url) as plain:
        reply = await plain.call("POST", "/api/streams", json_body=clip(vtest_avi, "asks", rules=rules))
        assert reply.status == 400, reply
        (problem,) = reply.body["detail"]
        assert problem["field"] == "rules.1.type" and "'smoke'" in problem["message"]
        assert "vlm.endpoints" in problem["message"]
        assert (await plain.call("GET", "/api/streams")).body["streams"] == []
    config = make_config(streams=[clip(vtest_avi, "cam", rules=rules)])
    assert config_rule_problems(config, on={"descriptions"}) is None
    problem = config_rule_problems(config, on=())
    assert problem and problem.startswith("streams.0.rules.1.type: rule 'smoke'")


def test_serve_refuses_a_vlm_rule_without_a_vlm(tmp_path: Path, vtest_avi: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        f"streams:\n  - id: cam\n    url: {vtest_avi}\n    rules: [{{id: smoke, type: vlm, question: 'Any smoke?'}}]\n"
    )
    line = one_error_line(vidsentry("serve", "--config", str(path), "--port", "0"), 2)
    assert "streams.0.rules.0.type" in line and "--vlm-url" in line
