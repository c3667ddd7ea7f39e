"""`vidsentry doctor`'s VLM checks against the simulator: one clear line for each thing wrong."""

from __future__ import annotations

import asyncio
import os
import sys

from engines.registry import EngineCheck
from engines.vlm.probe import probe_endpoint
from tests.support.vllm_sim import DEFAULT_MODEL, VllmSimulator


def failures(checks: list[EngineCheck]) -> dict[str, str]:
    """What failed, by check (models, model, priority, image, prefix cache)."""
    return {c.name.rsplit(" ", 1)[-1] if "prefix" not in c.name else "prefix cache": c.detail
            for c in checks if not c.available}  # "frame size" as "size"


async def test_a_healthy_endpoint_passes_every_check() -> None:
    async with VllmSimulator(max_model_len=16384) as sim:
        checks = await probe_endpoint(sim.url, DEFAULT_MODEL)
    assert [c.name.removeprefix(f"vlm {sim.url} ") for c in checks] == [
        "models", "model", "priority", "image", "prefix cache", "frame size", "images by uuid", "json schema",
        "streaming usage", "cache salt"]
    assert all(c.available for c in checks), failures(checks)
    assert "each frame sent once" in checks[6].detail
    assert all(c.available for c in checks)
    assert "max_model_len 16384" in checks[1].detail
    assert "one 448x252 image answered" in checks[3].detail
    assert checks[5].detail == "a 448x252 frame costs 146 prompt tokens"  # 16 x 9 tiles + 2 markers
    body = sim.requests[0]
    assert body["max_tokens"] == 1 and body["priority"] == 1
    assert sum(p["type"] == "image_url" for p in body["messages"][0]["content"]) == 1


async def test_each_misconfiguration_is_named_with_its_fix() -> None:
    async with VllmSimulator(scheduling_policy="fcfs", prompt_tokens_details=False) as sim:
        wrong = failures(await probe_endpoint(sim.url, DEFAULT_MODEL))
    assert set(wrong) == {"priority", "prefix cache"}
    assert "--scheduling-policy priority" in wrong["priority"]
    assert "--enable-prompt-tokens-details" in wrong["prefix cache"]

    async with VllmSimulator(min_pixels=200704, max_pixels=200704) as sim:  # frames scaled up to 12 x 22 tiles
        resized = failures(await probe_endpoint(sim.url, DEFAULT_MODEL))["size"]
        assert "costs 266 prompt tokens, not 146" in resized and '"max_pixels": 112896' in resized

    async with VllmSimulator(limit_images=0) as sim:
        assert "--limit-mm-per-prompt" in failures(await probe_endpoint(sim.url, DEFAULT_MODEL))["image"]

    async with VllmSimulator() as sim:
        wrong = failures(await probe_endpoint(sim.url, "Qwen/Qwen2.5-VL-72B-Instruct"))
        assert wrong == {"model": f"'Qwen/Qwen2.5-VL-72B-Instruct' is not served here; set vlm.model to one of: "
                                  f"{DEFAULT_MODEL} (or start vllm serve Qwen/Qwen2.5-VL-72B-Instruct)"}
        wrong = failures(await probe_endpoint(sim.url.removesuffix("/v1"), DEFAULT_MODEL))
        assert "ending in /v1" in wrong["models"]

    async with VllmSimulator(api_key="sk-1") as sim:
        assert "API key was refused" in failures(await probe_endpoint(sim.url, DEFAULT_MODEL))["models"]
        assert not failures(await probe_endpoint(sim.url, DEFAULT_MODEL, api_key="sk-1"))
        url = sim.url
    assert "cannot reach" in failures(await probe_endpoint(url, DEFAULT_MODEL))["models"]


async def test_the_doctor_command_checks_the_configured_endpoint() -> None:
    async with VllmSimulator(scheduling_policy="fcfs") as sim:
        env = {**os.environ, "VIDSENTRY_VLM__ENDPOINTS": f"[{sim.url}]"}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "realtime.cli", "doctor", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 60)
    lines = [line for line in out.decode().splitlines() if line.startswith("vlm ")]
    assert process.returncode == 1, err.decode()
    assert [line.split()[2] for line in lines] == ["models", "model", "priority", "image", "prefix", "frame",
                                                   "images", "json", "streaming", "cache"]
    assert "no   priority scheduling is off" in next(line for line in lines if " priority " in line)


async def test_doctor_takes_the_endpoint_and_model_as_flags() -> None:
    async with VllmSimulator() as sim:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "realtime.cli", "doctor", "--vlm-url", sim.url, "--vlm-model", "other/model",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1, err.decode()
    assert f"vlm {sim.url} model" in out.decode() and "'other/model' is not served here" in out.decode()


async def test_what_a_server_other_than_vllm_takes_is_reported() -> None:
    async with VllmSimulator(images="data", answers="prose", refuse_fields=("cache_salt", "stream_options")) as sim:
        checks = {c.name.removeprefix(f"vlm {sim.url} "): c for c in await probe_endpoint(sim.url, DEFAULT_MODEL)}
    assert checks["images by uuid"].available and "only as data URLs" in checks["images by uuid"].detail
    assert checks["json schema"].available and "ignores response_format" in checks["json schema"].detail
    assert not checks["streaming usage"].available and "include_usage" in checks["streaming usage"].detail
    assert not checks["cache salt"].available and "tenants share" in checks["cache salt"].detail
    assert checks["priority"].available and checks["image"].available
    assert "unknown" in checks["frame size"].detail and not checks["prefix cache"].available

    async with VllmSimulator(answers="text") as sim:
        checks = {c.name.removeprefix(f"vlm {sim.url} "): c for c in await probe_endpoint(sim.url, DEFAULT_MODEL)}
    assert not checks["json schema"].available and "structured outputs" in checks["json schema"].detail
