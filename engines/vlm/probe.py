"""`vidsentry doctor` for a vLLM endpoint: is it there, does it serve the model, does a one-image
request come back, and is the server started the way the describer needs it. One line per check,
saying what is wrong and which `vllm serve` flag or setting fixes it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import aiohttp
import numpy as np

from engines.registry import EngineCheck
from engines.vlm.client import VlmSettings, create_vlm_client
from engines.vlm.errors import VlmContextTooLong, VlmError, VlmTooManyImages
from engines.vlm.images import encode_image
from engines.vlm.types import VlmMessage, VlmRequest, VlmText
from engines.vlm.wire import parse_error

PROBE_TEXT = "vidsentry doctor: a probe. Answer with one word."
SCHEMA_TEXT = 'vidsentry doctor: a probe. Is the sky blue on a clear day? Answer as JSON: {"answer": "yes" or "no"}'
PROBE_SCHEMA: dict[str, Any] = {"title": "probe", "type": "object", "required": ["answer"],
                                "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}}}


async def probe_endpoint(
    url: str, model: str, *, api_key: str | None = None, image_size: tuple[int, int] = (448, 252),
    timeout_s: float = 20.0,
) -> list[EngineCheck]:
    """Checks of one endpoint, each an EngineCheck named `vlm <url> <what>`."""
    name = f"vlm {url}"
    served, problem = await _models(url, api_key, timeout_s)
    if served is None:
        return [EngineCheck(f"{name} models", False, problem)]
    checks = [EngineCheck(f"{name} models", True, f"reachable; serves {', '.join(served) or 'nothing'}")]
    if model not in served:
        checks.append(EngineCheck(f"{name} model", False, f"{model!r} is not served here; set vlm.model to one of: "
                                  f"{', '.join(served)} (or start vllm serve {model})"))
        return checks
    length = served[model]
    checks.append(EngineCheck(f"{name} model", True, model + (f", max_model_len {length}" if length else "")))
    return checks + await _requests(url, model, api_key, image_size, timeout_s)


async def _models(url: str, api_key: str | None, timeout_s: float) -> tuple[dict[str, int | None] | None, str]:
    """The models an endpoint serves (id -> max_model_len), or None and what is wrong."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(url.rstrip("/") + "/models", headers=headers) as response,
        ):
            status, raw = response.status, await response.content.read(1 << 20)
    except (aiohttp.ClientError, TimeoutError) as exc:
        reason = str(exc) or type(exc).__name__
        return None, f"cannot reach {url}: {reason} (is vllm serve running, and is the URL right?)"
    if status != 200:
        hint = {401: "; the API key was refused (vlm.api_key_env names its variable)",
                404: "; the URL should be the API base, ending in /v1"}.get(status, "")
        return None, f"GET /models answered HTTP {status}: {parse_error(status, raw).message}{hint}"
    try:
        data: Any = json.loads(raw)
    except ValueError:
        data = None
    cards = data.get("data") if isinstance(data, dict) else None
    if not isinstance(cards, list):
        return None, "GET /models did not answer like an OpenAI-compatible server (the URL should end in /v1)"
    served: dict[str, int | None] = {}
    for card in cards:
        if isinstance(card, dict) and isinstance(card.get("id"), str):
            length = card.get("max_model_len")
            served[card["id"]] = length if isinstance(length, int) else None
    return served, ""


async def _requests(
    url: str, model: str, api_key: str | None, image_size: tuple[int, int], timeout_s: float
) -> list[EngineCheck]:
    name = f"vlm {url}"
    image = encode_image(np.full((image_size[1], image_size[0], 3), 128, np.uint8), image_size)
    user = VlmMessage("user", (VlmText(PROBE_TEXT), image))
    request = VlmRequest((user,), route_key="doctor", max_tokens=1, priority=1, cache_salt="vidsentry-doctor",
                         timeout_s=timeout_s)
    client = create_vlm_client(VlmSettings(endpoints=(url,), model=model, api_key=api_key, max_retries=0))
    checks: list[EngineCheck] = []
    try:
        first = await client.complete(request)
        omitted = client.stats().endpoints[0].omitted  # optional fields the server refused as unknown
        if "priority" in omitted:
            checks.append(EngineCheck(f"{name} priority", False, "priority scheduling is off: start vllm serve with "
                                      "--scheduling-policy priority (alert checks go ahead of descriptions)"))
        else:
            checks.append(EngineCheck(f"{name} priority", True, "priority scheduling on"))
        checks.append(EngineCheck(
            f"{name} image", True,
            f"one {image_size[0]}x{image_size[1]} image answered in {first.latency_ms:.0f} ms "
            f"({first.prompt_tokens} prompt tokens)"))
        again = await client.complete(request)  # the same image: by uuid alone where the server takes that
        checks.append(_cache_check(name, again.cached_tokens))
        text_only = await client.complete(dataclasses.replace(request, messages=(VlmMessage("user", user.parts[:1]),)))
        checks.append(_frame_cost(name, model, image_size, first.prompt_tokens - text_only.prompt_tokens))
        checks.append(_uuid_check(name, client.stats().uuid_refusals))
        schema = dataclasses.replace(request, messages=(VlmMessage("user", (VlmText(SCHEMA_TEXT),)),),
                                     max_tokens=40, json_schema=PROBE_SCHEMA)
        checks.append(_schema_check(name, (await client.complete(schema)).form))
        checks += _field_checks(name, client.stats().endpoints[0].omitted, first.prompt_tokens)
    except VlmTooManyImages as exc:
        checks.append(EngineCheck(f"{name} image", False, f"the server takes {exc.limit} images per prompt: serve a "
                                  "vision model and set --limit-mm-per-prompt to the frames an epoch may hold"))
    except VlmContextTooLong as exc:
        checks.append(EngineCheck(f"{name} image", False, f"one image does not fit the context: {exc}"))
    except VlmError as exc:
        checks.append(EngineCheck(f"{name} image", False, f"a one-image request failed: {exc}"))
    finally:
        await client.aclose()
    return checks


def _uuid_check(name: str, refusals: int) -> EngineCheck:
    if refusals:
        return EngineCheck(f"{name} images by uuid", True, "the server takes images only as data URLs (vLLM before "
                           "0.11, or another server): every request carries its window's frames again; vLLM 0.11 "
                           "or later sends each frame once")
    return EngineCheck(f"{name} images by uuid", True, "images it holds go by uuid alone, each frame sent once")


def _schema_check(name: str, form: str | None) -> EngineCheck:
    if form == "json":
        return EngineCheck(f"{name} json schema", True, "answers keep to response_format's JSON schema")
    if form == "extracted":
        return EngineCheck(f"{name} json schema", True, "the server ignores response_format; the JSON is read from "
                           "the model's prose or code fence (counted as vlm answers 'extracted')")
    return EngineCheck(f"{name} json schema", False, "the server ignores response_format and the model answered in "
                       "prose: descriptions are kept as text, alert checks read yes or no from the first word, and "
                       "answers to questions go out with their citations unchecked; serve with structured outputs "
                       "(vLLM does by default; llama.cpp needs a build with json_schema support)")


def _field_checks(name: str, omitted: tuple[str, ...], prompt_tokens: int) -> list[EngineCheck]:
    usage = "stream_options" not in omitted and prompt_tokens > 0
    return [
        EngineCheck(f"{name} streaming usage", usage, "token counts come with each streamed answer" if usage else
                    "the stream carries no usage: prompt and cached tokens are not counted (vLLM sends them with "
                    "stream_options.include_usage)"),
        EngineCheck(f"{name} cache salt", "cache_salt" not in omitted,
                    "cache_salt keeps tenants' prefix caches apart" if "cache_salt" not in omitted else
                    "the server refused cache_salt: tenants share its prefix cache (vLLM takes it since 0.9)"),
    ]


def _frame_cost(name: str, model: str, size: tuple[int, int], tokens: int) -> EngineCheck:
    """What one frame costs. Qwen2-VL-family models spend one token per 28x28 px (plus 2 markers);
    more means the server resizes frames, which costs tokens and changes their cache identity."""
    if tokens <= 0:
        return EngineCheck(f"{name} frame size", True, "what a frame costs is unknown: the server reports no usage")
    detail = f"a {size[0]}x{size[1]} frame costs {tokens} prompt tokens"
    qwen = "qwen2" in model.lower() and "vl" in model.lower()
    expected = (size[0] // 28) * (size[1] // 28) + 2
    if qwen and size[0] % 28 == 0 and size[1] % 28 == 0 and tokens != expected:
        pixels = size[0] * size[1]
        return EngineCheck(f"{name} frame size", False, f"{detail}, not {expected}: the server resizes frames; start "
                           f"vllm serve with --mm-processor-kwargs '{{\"min_pixels\": {pixels}, \"max_pixels\": "
                           f"{pixels}}}' to match vlm.frame_width x vlm.frame_height")
    return EngineCheck(f"{name} frame size", True, detail)


def _cache_check(name: str, cached_tokens: int | None) -> EngineCheck:
    if cached_tokens is None:
        return EngineCheck(f"{name} prefix cache", False, "a repeated prompt reported no cached tokens: start vllm "
                           "serve with --enable-prompt-tokens-details, and keep prefix caching on")
    if cached_tokens == 0:
        return EngineCheck(f"{name} prefix cache", False, "a repeated prompt reused nothing: is prefix caching "
                           "off (--no-enable-prefix-caching)?")
    return EngineCheck(f"{name} prefix cache", True, f"a repeated prompt reused {cached_tokens} cached tokens")


def probe_endpoints(endpoints: tuple[str, ...], model: str, *, api_key: str | None = None,
                    image_size: tuple[int, int] = (448, 252)) -> list[EngineCheck]:
    """Every endpoint's checks, from synchronous code (the doctor command)."""

    async def run() -> list[EngineCheck]:
        results = await asyncio.gather(*(probe_endpoint(url, model, api_key=api_key, image_size=image_size)
                                         for url in endpoints))
        return [check for checks in results for check in checks]

    return asyncio.run(run())
