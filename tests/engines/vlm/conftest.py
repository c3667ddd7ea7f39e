"""VLM fixtures: a running vLLM simulator, clients that are always closed, real JPEG frames."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import cv2
import numpy as np
import pytest

from engines.vlm.client import VlmClient, VlmSettings, create_vlm_client
from engines.vlm.images import encode_image
from engines.vlm.types import VlmImage
from tests.support.vllm_sim import VllmSimulator

FRAME_SIZE = (448, 252)  # 16 x 9 tiles of 28 px: 144 tokens per image on Qwen2.5-VL

MakeClient = Callable[..., Awaitable[VlmClient]]


@pytest.fixture
async def sim() -> AsyncIterator[VllmSimulator]:
    async with VllmSimulator() as server:
        yield server


@pytest.fixture
async def make_client() -> AsyncIterator[MakeClient]:
    clients: list[VlmClient] = []

    async def make(
        *endpoints: str,
        model: str = "Qwen/Qwen2.5-VL-7B-Instruct",
        clock: Callable[[], float] | None = None,
        **overrides: Any,
    ) -> VlmClient:
        settings = VlmSettings(endpoints=tuple(endpoints), model=model, **overrides)
        client = create_vlm_client(settings) if clock is None else VlmClient(settings, clock=clock)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


def frame(index: int) -> VlmImage:
    """A distinct 640x480 scene per index (a moving box on a gradient), letterboxed and encoded."""
    image = np.tile(np.linspace(0, 255, 640, dtype=np.uint8), (480, 1))
    bgr = cv2.merge([image, np.flipud(image), np.full_like(image, 60)])
    x = 20 + 37 * index % 560
    cv2.rectangle(bgr, (x, 200), (x + 60, 330), (0, 0, 255), -1)
    cv2.putText(bgr, f"#{index}", (20, 460), cv2.FONT_HERSHEY_SIMPLEX, 1.0, (255, 255, 255), 2)
    return encode_image(bgr, FRAME_SIZE)


@pytest.fixture(scope="session")
def frames() -> list[VlmImage]:
    return [frame(i) for i in range(12)]

