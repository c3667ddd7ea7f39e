"""A real third-party WHIP client publishes to the service: Meetecho's `simple-whip-client`
(GStreamer's webrtcbin underneath, trickling its candidates over PATCH) sends a test pattern
and spoken narration to `POST /whip/{stream}`, and the session's detections and captions arrive
on NATS like any browser session's; its DELETE on exit ends the session."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.service import CaptionModels, LiveService, live_service, make_config
from tests.support.speech import script, words_of
from tests.support.waiting import wait_until
from tests.support.whip_client import TEST_PATTERN, build_shim, publishing, speech_pipeline

pytestmark = pytest.mark.slow
TOKEN = "whip-client-token"


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim(tmp_path_factory.mktemp("whip-shim"))


@pytest.fixture
async def svc(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, caption_models: CaptionModels
) -> AsyncIterator[LiveService]:
    async with live_service(
        detector, shared_nats_server.url, config=make_config(), token=TOKEN, captions=caption_models
    ) as live:
        yield live


async def test_simple_whip_client_publishes_and_its_detections_and_captions_arrive(
    svc: LiveService, shared_nats_server: EmbeddedNatsServer, sample_dir: Path, shim: Path, tmp_path: Path
) -> None:
    events: dict[str, list[dict[str, Any]]] = {"detections": [], "captions": [], "status": []}
    nc = await nats.connect(shared_nats_server.url)

    async def collect(msg: Any) -> None:
        kind = msg.subject.rsplit(".", 1)[-1]
        if kind in events:
            events[kind].append(json.loads(msg.data))

    await nc.subscribe("vidsentry.whip-cam.>", cb=collect)
    try:
        audio = speech_pipeline(sample_dir / "narration.wav")
        url = f"{svc.url}/whip/whip-cam"
        async with publishing(url, video=TEST_PATTERN, audio=audio, shim=shim, log=tmp_path / "client.log",
                              token=TOKEN) as client:
            await wait_until(lambda: len(events["detections"]) >= 10 or client.process.returncode is not None, 30,
                             lambda: f"detections from the WHIP client; its output:\n{client.output()}")
            assert client.process.returncode is None, client.output()
            stream = await svc.stream("whip-cam")
            assert stream["kind"] == "webrtc" and stream["state"] == "live"
            assert {d["width"] for d in events["detections"]} == {640}  # the test pattern's frames
            heard = lambda: " ".join(c["text"] for c in events["captions"])  # noqa: E731
            await wait_until(lambda: len(words_of(heard())) >= 5, 60,
                             lambda: f"captions of the narration; heard {heard()!r}")
            narration = set(words_of(script()))
            said = words_of(heard())
            assert sum(word in narration for word in said) >= 0.8 * len(said), heard()  # the narration, not noise
        # SIGTERM: the client DELETEs its resource, which ends the session as a stop.
        await wait_until(lambda: "whip-cam" not in svc.service.sessions, 15, "the session to end")
        assert svc.service.sessions.ended["stopped"] >= 1
        assert client.process.returncode == 0, client.output()
        assert "[WARN]" not in client.output().split("Disconnecting", 1)[-1]  # the DELETE was answered 200
    finally:
        await nc.close()
