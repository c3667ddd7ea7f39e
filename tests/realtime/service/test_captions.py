"""Live captions through the running service, with the real tiny.en model and Silero VAD: a
browser session's speech, a file and an RTSP camera (both ingest backends); finals on NATS and
over the DataChannel, never changed afterwards, with word times inside the audio, and WebVTT."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from engines.detector import Detector
from pipelines.captions.engine import CAPTIONS
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.peer import connect, load_frames, load_speech
from tests.support.rtsp import RtspServer
from tests.support.service import CaptionModels, LiveService, Reply, live_service, make_config
from tests.support.speech import script_prefix_wer, words_of
from tests.support.waiting import eventually, wait_until

pytestmark = pytest.mark.slow

VTT_CUE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})$")


@pytest.fixture
async def svc(
    detector: Detector, shared_nats_server: EmbeddedNatsServer, caption_models: CaptionModels
) -> AsyncIterator[LiveService]:
    config = make_config(webrtc={"inactivity_timeout_s": 2.0})
    async with live_service(detector, shared_nats_server.url, config=config, captions=caption_models) as live:
        yield live


class Finals:
    """Every `captions` and `transcript` event on NATS for one stream."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.transcripts: list[dict[str, Any]] = []

    async def start(self, url: str, stream_id: str) -> nats.NATS:
        nc = await nats.connect(url)

        async def on_message(msg: Any) -> None:
            kept = self.bodies if msg.subject.endswith(".captions") else self.transcripts
            kept.append(json.loads(msg.data))

        await nc.subscribe(f"vidsentry.{stream_id}.captions", cb=on_message)
        await nc.subscribe(f"vidsentry.{stream_id}.transcript", cb=on_message)
        return nc

    @property
    def text(self) -> str:
        return " ".join(b["text"] for b in self.bodies)

    def read_back(self) -> str:
        """The finals in order, each transcript's text in place of the finals it names."""
        replaced = {r: t for t in self.transcripts for r in t["replaces"]}
        parts = []
        for body in self.bodies:
            transcript = replaced.get(body["segment_id"])
            if transcript is None:
                parts.append(body["text"])
            elif transcript["replaces"][0] == body["segment_id"]:
                parts.append(transcript["text"])
        return " ".join(parts)


def assert_finals_are_final(bodies: list[dict[str, Any]], *, within: tuple[float, float]) -> None:
    ids = [b["segment_id"] for b in bodies]
    assert len(ids) == len(set(ids)), "a segment was finalized twice"
    for body in bodies:
        words = body["words"]
        assert words and body["text"] and body["model"] and body["language"] == "en"
        assert body["start"] == words[0]["start"] and body["end"] == words[-1]["end"]
        for word in words:
            assert within[0] - 0.05 <= word["start"] <= word["end"] <= within[1] + 0.05, (word, within)
            assert 0.0 <= word["probability"] <= 1.0


def assert_valid_webvtt(text: str, words: list[str]) -> None:
    blocks = text.strip("\n").split("\n\n")
    assert blocks[0] == "WEBVTT"
    previous = -1.0
    for number, block in enumerate(blocks[1:], 1):
        lines = block.split("\n")
        assert lines[0] == str(number) and len(lines) == 3 and lines[2].strip()
        match = VTT_CUE.match(lines[1])
        assert match, lines[1]
        h1, m1, s1, ms1, h2, m2, s2, ms2 = (int(g) for g in match.groups())
        start, end = h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000
        assert previous <= start < end
        previous = start
    assert vtt_words(text) == words


def vtt_words(text: str) -> list[str]:
    """The words of a WebVTT's cues, in order."""
    return words_of(" ".join(" ".join(block.split("\n")[2:]) for block in text.strip("\n").split("\n\n")[1:]))


async def test_a_browser_sessions_speech_is_captioned_on_the_channel_and_nats(
    svc: LiveService, vtest_avi: Path, sample_dir: Path, shared_nats_server: EmbeddedNatsServer
) -> None:
    frames = load_frames(vtest_avi, count=10)
    speech = load_speech(sample_dir / "narration.wav", seconds=10.0)
    peer = await connect(svc.session, svc.url, frames=frames, speech=speech, fps=5)
    finals = Finals()
    nc = await finals.start(shared_nats_server.url, peer.stream_id)
    try:
        await peer.wait_for(lambda: len(peer.of_kind("captions")) >= 3, 40, "three finals on the DataChannel")
        await wait_until(lambda: len(finals.bodies) >= 3, 10, "three finals on NATS")
        # The speech ends after 10 s: its last utterance is transcribed whole, on both paths.
        await peer.wait_for(lambda: bool(peer.of_kind("transcript")), 40, "a transcript on the DataChannel")
        await wait_until(lambda: bool(finals.transcripts), 10, "a transcript on NATS")

        async def vtt_as_kept() -> tuple[Reply, list[str]] | None:
            """The WebVTT once it reads as what NATS delivered: the last events have settled."""
            reply = await svc.call("GET", f"/api/streams/{peer.stream_id}/captions.vtt")
            kept = words_of(finals.read_back())
            return (reply, kept) if reply.status == 200 and vtt_words(reply.body) == kept else None

        reply, kept = await eventually(vtt_as_kept, 10, "the WebVTT to read as the finals and transcripts on NATS")
        channel_finals = [m["body"] for m in peer.of_kind("captions")]
        assert [b["segment_id"] for b in channel_finals][:3] == [b["segment_id"] for b in finals.bodies][:3]
        assert peer.of_kind("partials"), "partials come before finals"
        elapsed = (await svc.stream(peer.stream_id))["counters"]["audio_seconds"]
        assert_finals_are_final(finals.bodies, within=(0.0, elapsed + 1.0))
        assert words_of(finals.text)[:4] == ["good", "morning", "this", "is"] or script_prefix_wer(finals.text) <= 0.3
        assert reply.headers["Content-Type"].startswith("text/vtt")
        # The WebVTT reads what was kept: each transcript in place of the finals it replaces.
        segments = [b["segment_id"] for b in finals.bodies]
        for transcript in finals.transcripts:
            assert transcript["replaces"] and set(transcript["replaces"]) <= set(segments)
            assert transcript["model"] and transcript["words"] and transcript["revised"] in (True, False)
        assert_valid_webvtt(reply.body, kept)
        metrics = (await svc.call("GET", "/metrics")).body
        decodes = re.search(r"^vidsentry_asr_decodes_total ([0-9.e+]+)$", metrics, re.M)
        assert decodes and float(decodes.group(1)) > 0 and "vidsentry_asr_alive 1.0" in metrics
    finally:
        await peer.close()
        await nc.close()


@pytest.mark.parametrize("source", ["file-gstreamer", "rtsp-pyav"])
async def test_camera_speech_is_captioned_within_20_percent_wer(
    svc: LiveService, sample_clip: Path, tmp_path: Path, shared_nats_server: EmbeddedNatsServer, source: str
) -> None:
    kind, ingest = source.split("-")
    rtsp: RtspServer | None = None
    if kind == "rtsp":
        rtsp = RtspServer(clip=sample_clip, log_path=tmp_path / "rtsp.log").start()
        url = rtsp.url("/vtest")
    else:
        url = str(sample_clip)
    finals = Finals()
    nc = await finals.start(shared_nats_server.url, "cam")
    try:
        reply = await svc.call("POST", "/api/streams", json_body={"id": "cam", "url": url, "ingest": ingest})
        assert reply.status == 201, reply
        await svc.wait_for_state("cam", "live")
        started = time.monotonic()
        await wait_until(lambda: len(words_of(finals.text)) >= 30, 40, "30 words of finals")
        assert time.monotonic() - started < 40
        assert (await svc.call("DELETE", "/api/streams/cam")).status == 204
        await wait_until(lambda: "cam" not in svc.service.registry and svc.service.registry.running_count == 0,
                         15, "the stream to stop")
        await asyncio.sleep(0.5)
        assert script_prefix_wer(finals.text) <= 0.20, finals.text
        assert_finals_are_final(finals.bodies, within=(0.0, 60.0))
    finally:
        await nc.close()
        if rtsp is not None:
            rtsp.close()


async def test_streams_without_captions_still_count_their_audio(svc: LiveService, sample_clip: Path) -> None:
    body = {"id": "quiet", "url": str(sample_clip), "captions": False}
    reply = await svc.call("POST", "/api/streams", json_body=body)
    assert reply.status == 201
    await wait_until(lambda: svc.service.registry.runner("quiet") is not None, 10, "the run")
    await svc.wait_for_state("quiet", "live")

    async def two_seconds_heard() -> dict[str, Any] | None:
        counters: dict[str, Any] = (await svc.stream("quiet"))["counters"]
        return counters if counters["audio_seconds"] >= 2.0 else None

    counters = await eventually(two_seconds_heard, 20, "two seconds of the stream's audio counted")
    assert counters["asr_decodes"] == 0 and counters["captions"] == 0
    assert (await svc.call("DELETE", "/api/streams/quiet")).status == 204
    unknown = await svc.call("GET", "/api/streams/nobody/captions.vtt")
    assert unknown.status == 404


async def test_a_session_that_vanishes_mid_sentence_leaves_nothing_behind(
    svc: LiveService, vtest_avi: Path, sample_dir: Path
) -> None:
    frames = load_frames(vtest_avi, count=5)
    speech = load_speech(sample_dir / "narration.wav", seconds=8.0)
    peer = await connect(svc.session, svc.url, frames=frames, speech=speech, fps=5)
    stream_id = peer.stream_id
    await peer.wait_for(lambda: bool(peer.of_kind("partials")), 30, "a partial: someone is mid-sentence")
    await peer.close()  # the tab is gone
    await wait_until(lambda: stream_id not in svc.service.registry, 15, "the session's stream to go")
    await wait_until(lambda: svc.service.registry.running_count == 0, 15, "its run to end")
    await wait_until(
        lambda: not [t for t in asyncio.all_tasks() if stream_id in t.get_name() and not t.done()], 10, "its tasks"
    )
    await wait_until(
        lambda: not [t for t in threading.enumerate() if t.name.endswith("-decoder")], 10, "aiortc's decoder threads"
    )
    engine = svc.service.engines.get(CAPTIONS)
    assert engine is not None and engine.batcher.alive
