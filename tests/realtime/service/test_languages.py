"""Captions in the language spoken, and an English track, through the running service with the real
multilingual Whisper base: a camera speaking Spanish over RTSP gets Spanish captions with their
language on every body, an English `translations` event per transcript, and one WebVTT per language."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from engines.detector import Detector
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.languages import speech_clip, spoken
from tests.support.rtsp import RtspServer
from tests.support.service import CaptionModels, LiveService, live_service, make_config
from tests.support.speech import words_of
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
async def svc(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, multilingual_models: CaptionModels
) -> AsyncIterator[LiveService]:
    config = make_config(captions={"model": "base", "language": "auto", "translate": "en"})
    async with live_service(detector, shared_nats_server.url, config=config, captions=multilingual_models) as live:
        yield live


async def test_a_camera_speaking_spanish_gets_spanish_captions_and_an_english_track(
    svc: LiveService, shared_nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    clip = speech_clip(tmp_path / "es.mp4", spoken("es", 2, lead_s=1.0))
    rtsp = RtspServer(clip=clip, log_path=tmp_path / "rtsp.log").start()
    bodies: dict[str, list[dict[str, Any]]] = {"captions": [], "transcript": [], "translations": []}
    nc = await nats.connect(shared_nats_server.url)

    async def on_message(msg: Any) -> None:
        bodies[msg.subject.rsplit(".", 1)[1]].append(json.loads(msg.data))

    try:
        for kind in bodies:
            await nc.subscribe(f"vidsentry.cam.{kind}", cb=on_message)
        reply = await svc.call("POST", "/api/streams", json_body={"id": "cam", "url": rtsp.url("/vtest")})
        assert reply.status == 201, reply
        await wait_until(lambda: len(bodies["translations"]) >= 2, 60, "two English lines")
        assert all(b["language"] == "es" for b in bodies["captions"] + bodies["transcript"]), bodies
        assert {"buenos", "días", "tren"} & set(words_of(" ".join(b["text"] for b in bodies["transcript"])))
        english = bodies["translations"]
        assert all(t["language"] == "en" and t["spoken_language"] == "es" for t in english)
        assert "morning" in words_of(" ".join(t["text"] for t in english)), english

        spanish_vtt = await svc.call("GET", "/api/streams/cam/captions.vtt?language=es")
        assert spanish_vtt.status == 200 and "-->" in spanish_vtt.body
        french_vtt = await svc.call("GET", "/api/streams/cam/captions.vtt?language=fr")
        assert french_vtt.status == 200 and french_vtt.body == "WEBVTT\n"
        english_vtt = await svc.call("GET", "/api/streams/cam/translation.vtt")
        assert english_vtt.status == 200 and "morning" in english_vtt.body.lower()
        languages = await svc.call("GET", "/api/streams/cam/captions/languages")
        assert languages.body == {"spoken": ["es"], "translations": ["en"]}
        bad = await svc.call("GET", "/api/streams/cam/captions.vtt?language=../x")
        assert bad.status == 400 and "language" in json.dumps(bad.body)
        assert (await svc.call("DELETE", "/api/streams/cam")).status == 204
    finally:
        await nc.close()
        rtsp.close()
