"""The `vlm:` config section, owned by the descriptions capability: the vLLM endpoints, the client's
resilience and the describer's sampling (defaults from the dataclasses they build)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from engines.vlm.client import VlmSettings
from pipelines.describe.settings import DescribeSettings
from pipelines.sections import MAX_TIMEOUT_S, Section, default_of


def _describe(name: str) -> Any:
    return default_of(DescribeSettings, name)


def _vlm(name: str) -> Any:
    return default_of(VlmSettings, name)


class VlmConfig(Section):
    """Scene descriptions and `vlm` rules through vLLM's OpenAI-compatible API. No endpoints: off."""

    # Base URLs such as http://vllm:8000/v1. A stream always goes to the same one (its prefix stays
    # cached there) and moves only while that one is down.
    endpoints: list[str] = []
    model: str = "Qwen/Qwen2.5-VL-7B-Instruct"
    # The name of the environment variable holding the API key (vLLM's --api-key); never the key.
    api_key_env: str = Field("VLLM_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # Per tenant: only requests with the same salt share cached prefix blocks. Keep it random.
    cache_salt: SecretStr | None = None
    # Every frame is letterboxed to this size; multiples of 28 px (one Qwen2.5-VL token per 28x28).
    frame_width: int = Field(_describe("frame_size")[0], ge=28, le=1792)
    frame_height: int = Field(_describe("frame_size")[1], ge=28, le=1792)
    min_interval_s: float = Field(_describe("min_interval_s"), gt=0, le=600)  # frames while things happen
    max_interval_s: float = Field(_describe("max_interval_s"), gt=0, le=3600)  # frames while nothing does
    describe_interval_s: float = Field(_describe("describe_interval_s"), ge=0.5, le=3600)
    max_frames: int = Field(_describe("max_frames"), ge=1, le=256)  # per epoch
    max_prompt_tokens: int = Field(_describe("max_prompt_tokens"), ge=1000, le=10_000_000)  # per epoch
    max_tokens: int = Field(_describe("max_tokens"), ge=16, le=4096)  # of a description
    timeout_s: float = Field(_describe("timeout_s"), gt=0, le=600)
    system_prompt: str | None = Field(None, min_length=1)  # None: the built-in one
    instruction: str | None = Field(None, min_length=1)
    max_retries: int = Field(_vlm("max_retries"), ge=0, le=10)
    breaker_failures: int = Field(_vlm("breaker_failures"), ge=1, le=10_000)
    breaker_reset_s: float = Field(_vlm("breaker_reset_s"), gt=0, le=MAX_TIMEOUT_S)
    max_in_flight: int = Field(_vlm("max_in_flight"), ge=1, le=1024)  # requests of all streams together

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r}: use an http(s):// base URL such as http://vllm:8000/v1")
            if "@" in url.split("//", 1)[1].split("/", 1)[0]:
                raise ValueError("put credentials in the API key (api_key_env), not in the URL")
        if len(set(urls)) != len(urls):
            raise ValueError("an endpoint is listed twice")
        return urls

    @model_validator(mode="after")
    def _intervals(self) -> VlmConfig:
        if self.min_interval_s > self.max_interval_s:
            raise ValueError("min_interval_s is larger than max_interval_s")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.endpoints)

    def client_settings(self, environ: Mapping[str, str] | None = None) -> VlmSettings:
        env = os.environ if environ is None else environ
        return VlmSettings(
            endpoints=tuple(self.endpoints),
            model=self.model,
            api_key=env.get(self.api_key_env) or None,
            max_retries=self.max_retries,
            breaker_failures=self.breaker_failures,
            breaker_reset_s=self.breaker_reset_s,
            max_in_flight=self.max_in_flight,
        )

    def describe_settings(self) -> DescribeSettings:
        defaults = DescribeSettings()
        return DescribeSettings(
            frame_size=(self.frame_width, self.frame_height),
            min_interval_s=self.min_interval_s,
            max_interval_s=self.max_interval_s,
            describe_interval_s=self.describe_interval_s,
            max_frames=self.max_frames,
            max_prompt_tokens=self.max_prompt_tokens,
            max_tokens=self.max_tokens,
            timeout_s=self.timeout_s,
            cache_salt=self.cache_salt.get_secret_value() if self.cache_salt is not None else None,
            system_prompt=self.system_prompt or defaults.system_prompt,
            instruction=self.instruction or defaults.instruction,
        )
