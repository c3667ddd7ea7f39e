"""Honest readiness: a dead shared detector fails every stream with a reason and turns /readyz red."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engines.detector import Detector
from engines.types import Detections
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.service import live_service
from tests.support.waiting import wait_until


class DropsAResult:
    """The real detector, but answering each batch with one result too few (a broken engine)."""

    def __init__(self, inner: Detector) -> None:
        self.inner = inner
        self.info, self.backend, self.max_batch = inner.info, inner.backend, inner.max_batch

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        return self.inner.detect(images)[:-1]


async def test_a_broken_detector_fails_every_stream_and_readyz_says_why(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, vtest_avi: Path
) -> None:
    async with live_service(DropsAResult(detector), shared_nats_server.url) as svc:  # type: ignore[arg-type]
        ready = await svc.call("GET", "/readyz")
        assert ready.status == 200 and ready.body["checks"]["detector"] is True
        for stream_id in ("a", "b"):
            reply = await svc.call("POST", "/api/streams", json_body={"id": stream_id, "url": str(vtest_avi)})
            assert reply.status == 201, reply
        for stream_id in ("a", "b"):
            await svc.wait_for_state(stream_id, "failed", within_s=20)
            body = await svc.stream(stream_id)
            assert body["reason"].startswith("detector failed: detector engine is broken"), body
        ready = await svc.call("GET", "/readyz")
        assert ready.status == 503 and "detector" in ready.body["detail"]["failing"], ready
        metrics = (await svc.call("GET", "/metrics")).body
        assert "vidsentry_detector_alive 0.0" in metrics
        await wait_until(lambda: svc.service.registry.running_count == 0, 10, "the failed runs to end")
