"""Captions in the language spoken, and an English track, through the running service with the real
multilingual Whisper base: a camera speaking Spanish over RTSP gets Spanish captions with their
language on every body, an English `translations` event per transcript, and one WebVTT per language."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.detector import Detector
from pipelines.captions.engine import CAPTIONS
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.languages import speech_clip, spoken
from tests.support.nats import heard_bodies
from tests.support.peer import connect, make_offer
from tests.support.rtsp import RtspServer
from tests.support.service import CaptionModels, LiveService, live_service, make_config
from tests.support.speech import words_of
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

SPOKEN_AND_ENGLISH = ("captions", "transcript", "translations")


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
    try:
        async with heard_bodies(shared_nats_server.url, ["cam"], SPOKEN_AND_ENGLISH) as heard:
            reply = await svc.call("POST", "/api/streams", json_body={"id": "cam", "url": rtsp.url("/vtest")})
            assert reply.status == 201, reply
            await wait_until(lambda: len(heard.of("cam", "translations")) >= 2, 60, "two English lines")
            spoken_bodies = heard.of("cam", "captions") + heard.of("cam", "transcript")
            assert all(b["language"] == "es" for b in spoken_bodies), heard
            said = words_of(" ".join(b["text"] for b in heard.of("cam", "transcript")))
            assert {"buenos", "días", "tren"} & set(said), said
            english = heard.of("cam", "translations")
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
        rtsp.close()


@pytest.fixture
async def two_models(
    detector: Detector,
    shared_nats_server: EmbeddedNatsServer,
    caption_models: CaptionModels,
    multilingual_models: CaptionModels,
) -> AsyncIterator[LiveService]:
    """The default service (tiny.en, English) that can also serve the multilingual base to the
    streams that name it (the session's model, lent)."""
    async with live_service(detector, shared_nats_server.url, config=make_config(), captions=caption_models,
                            more_models={"base": multilingual_models[0]}) as live:
        yield live


async def test_two_streams_each_in_its_own_model_and_language_and_only_one_translated(
    two_models: LiveService, shared_nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    svc = two_models
    clips = {
        "en": speech_clip(tmp_path / "en.mp4", spoken("en", 2, lead_s=1.0)),
        "es": speech_clip(tmp_path / "es.mp4", spoken("es", 2, lead_s=1.0)),
    }
    async with heard_bodies(shared_nats_server.url, ["en", "es"], SPOKEN_AND_ENGLISH) as heard:
        of = heard.of
        assert (await svc.call("POST", "/api/streams", json_body={"id": "en", "url": str(clips["en"])})).status == 201
        own = {"model": "base", "language": "auto", "translate": "en"}
        reply = await svc.call("POST", "/api/streams", json_body={"id": "es", "url": str(clips["es"]), "captions": own})
        assert reply.status == 201, reply
        await wait_until(lambda: bool(of("es", "translations")) and len(of("en", "transcript")) >= 2, 60,
                         "an English line of the Spanish stream and the English stream's transcripts")
        assert {b["language"] for b in of("es", "captions") + of("es", "transcript")} == {"es"}, heard
        assert {b["model"] for b in of("es", "captions")} == {"base"}
        assert {"buenos", "días", "tren", "sale"} & set(words_of(" ".join(b["text"] for b in of("es", "transcript"))))
        assert {b["language"] for b in of("en", "captions") + of("en", "transcript")} == {"en"}
        assert {b["model"] for b in of("en", "captions")} == {"tiny.en"}
        assert {"morning", "train", "hot"} & set(words_of(" ".join(b["text"] for b in of("en", "transcript"))))
        assert of("es", "translations")[0]["spoken_language"] == "es"
        assert not of("en", "translations"), "the English stream has no English track"
        assert (await svc.stream("es"))["counters"]["caption_model_refused"] == 0
        engine = svc.service.engines.get(CAPTIONS)
        assert engine is not None and engine.shelf is not None and engine.shelf.names == ["tiny.en", "base"]
        for stream in ("en", "es"):
            assert (await svc.call("DELETE", f"/api/streams/{stream}")).status == 204
        # The model no stream uses any more is closed (the section's stays).
        await wait_until(lambda: engine.shelf.names == ["tiny.en"], 10, "base closed once no stream uses it")


async def test_a_stream_naming_a_model_or_language_the_service_cannot_serve_is_refused_with_the_reason(
    two_models: LiveService,
) -> None:
    svc = two_models

    async def refused(captions: Any) -> str:
        body = {"id": "cam", "url": "rtsp://127.0.0.1:9/x", "captions": captions}
        reply = await svc.call("POST", "/api/streams", json_body=body)
        assert reply.status == 400, reply
        return json.dumps(reply.body)

    assert "tiny.en" in await refused({"model": "large-v3"})  # what a stream may name
    assert "Whisper knows" in await refused({"language": "xx"})
    # The section's tiny.en is English only: a language or an English track needs the stream's own base.
    assert "multilingual" in await refused({"language": "es"})
    assert "multilingual" in await refused({"translate": "en"})
    assert "multilingual" in await refused({"model": "tiny.en", "translate": "en"})
    assert (await svc.call("GET", "/api/streams")).body["streams"] == []


def browser_audio(samples: np.ndarray) -> np.ndarray:
    """16 kHz float speech as a browser's track decodes it: 48 kHz s16."""
    at_48k = np.interp(np.arange(len(samples) * 3) / 3, np.arange(len(samples)), samples)
    return (np.clip(at_48k, -1, 1) * 32767).astype(np.int16)


async def test_a_browser_speaking_spanish_gets_spanish_captions_on_nats_with_their_language(
    two_models: LiveService, shared_nats_server: EmbeddedNatsServer
) -> None:
    """The service captions English (tiny.en); the person on the browser camera says, in the
    offer, that they speak Spanish and want an English line too, as a stream added through the API
    can."""
    svc = two_models
    frames = [np.full((120, 160, 3), 96, np.uint8)] * 5
    own = {"captions": {"model": "base", "language": "es", "translate": "en"}}
    peer = await connect(svc.session, svc.url, frames=frames, speech=browser_audio(spoken("es", 2, lead_s=1.0)),
                         fps=5, own=own)
    sid = peer.stream_id
    try:
        async with heard_bodies(shared_nats_server.url, [sid], SPOKEN_AND_ENGLISH) as heard:
            await wait_until(lambda: bool(heard.of(sid, "transcript")) and bool(heard.of(sid, "translations")), 60,
                             "a transcript and its English line of the browser's speech")
            spoken_bodies = heard.of(sid, "captions") + heard.of(sid, "transcript")
            assert heard.of(sid, "captions") and {b["language"] for b in spoken_bodies} == {"es"}, heard
            said = words_of(" ".join(b["text"] for b in spoken_bodies))
            assert {"buenos", "días", "calor", "ciudad", "tren"} & set(said), said
            english = heard.of(sid, "translations")[0]
            assert english["spoken_language"] == "es" and english["language"] == "en", english
            # The same bodies reach the browser's own DataChannel.
            await peer.wait_for(lambda: bool(peer.of_kind("captions")), 10, "captions on the DataChannel")
            assert {m["body"]["language"] for m in peer.of_kind("captions")} == {"es"}
    finally:
        await peer.close()


async def test_an_offer_or_a_whip_url_asking_captions_the_service_cannot_serve_is_refused_before_negotiating(
    two_models: LiveService,
) -> None:
    svc = two_models
    pc, _, _ = await make_offer(frames=[np.zeros((120, 160, 3), np.uint8)], speech=None)
    try:
        sdp = pc.localDescription.sdp
        offer = {"sdp": sdp, "type": "offer"}
        # tiny.en, the section's model, is English only: another language needs the stream's own base.
        reply = await svc.call("POST", "/api/webrtc/offer", json_body={**offer, "captions": {"language": "es"}})
        assert reply.status == 400 and "multilingual" in json.dumps(reply.body), reply
        reply = await svc.call("POST", "/api/webrtc/offer", json_body={**offer, "captions": {"language": "xx"}})
        assert reply.status == 400 and "Whisper knows" in json.dumps(reply.body), reply
        # WHIP clients send only SDP: the endpoint URL carries the settings.
        reply = await svc.call("POST", "/whip/es-cam?captions.language=es", data=sdp, content_type="application/sdp")
        assert reply.status == 400 and "multilingual" in json.dumps(reply.body), reply
        reply = await svc.call("POST", "/whip/es-cam?colour=red", data=sdp, content_type="application/sdp")
        assert reply.status == 400 and "unknown parameter" in json.dumps(reply.body), reply
        reply = await svc.call("POST", "/whip/es-cam?captions=maybe", data=sdp, content_type="application/sdp")
        assert reply.status == 400 and "true or false" in json.dumps(reply.body), reply
        assert (await svc.call("GET", "/api/streams")).body["streams"] == []
        # What the service can serve is taken: the stream's own base, as a WHIP URL asks it.
        reply = await svc.call("POST", "/whip/es-cam?captions.model=base&captions.language=es",
                               data=sdp, content_type="application/sdp")
        assert reply.status == 201, reply
        listed = (await svc.call("GET", "/api/streams/es-cam")).body
        assert listed["captions"] == {"model": "base", "language": "es", "translate": None}, listed
    finally:
        await pc.close()
