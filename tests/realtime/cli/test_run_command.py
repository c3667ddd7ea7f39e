"""`vidsentry run` end to end as a user meets it: real models, real NATS, real decoding."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from engines.asr.types import SpeechRecognizer
from engines.asr.vad import VadModel
from pipelines.captions.engine import CaptionEngine, CaptionPolicy, SpeechBatcher
from pipelines.captions.printer import LINE_MAX_WORDS
from realtime.bus.connection import round_trip
from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.bodies import any_event
from tests.support.captions import Collect, caption
from tests.support.cli import ROOT, vidsentry
from tests.support.speech import load_pcm16k, script_prefix_wer
from tests.support.waiting import wait_until


def assert_usage_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("vidsentry: error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle.lower() in errors[0].lower(), errors[0]


@pytest.fixture
def nats_server(shared_nats_server: EmbeddedNatsServer) -> EmbeddedNatsServer:
    return shared_nats_server


def test_bad_scheme(nats_server: EmbeddedNatsServer) -> None:
    assert_usage_error(vidsentry("run", "ftp://example.com/cam", "--nats-url", nats_server.url), "scheme")


def test_missing_file(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    assert_usage_error(vidsentry("run", str(tmp_path / "nope.mp4"), "--nats-url", nats_server.url), "nope.mp4")


def test_bad_stream_id(sample_clip: Path, nats_server: EmbeddedNatsServer) -> None:
    proc = vidsentry("run", str(sample_clip), "--id", "front door!", "--nats-url", nats_server.url)
    assert_usage_error(proc, "stream id")


def test_unknown_model_file(sample_clip: Path, nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    assert_usage_error(
        vidsentry("run", str(sample_clip), "--model", str(tmp_path / "yolo.onnx"), "--nats-url", nats_server.url),
        "yolo.onnx",
    )
    not_a_model = tmp_path / "notes.onnx"
    not_a_model.write_text("this is not a model")
    assert_usage_error(
        vidsentry("run", str(sample_clip), "--model", str(not_a_model), "--nats-url", nats_server.url), "notes.onnx"
    )


def test_engine_that_is_missing_here(sample_clip: Path, nats_server: EmbeddedNatsServer) -> None:
    proc = vidsentry("run", str(sample_clip), "--engine", "tensorrt", "--nats-url", nats_server.url)
    assert_usage_error(proc, "tensorrt")


def test_unreachable_camera(nats_server: EmbeddedNatsServer) -> None:
    proc = vidsentry(
        "run", "rtsp://127.0.0.1:1/cam", "--connect-attempts", "2", "--nats-url", nats_server.url, "--json"
    )
    assert_usage_error(proc, "127.0.0.1:1")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["state"] == "failed" and summary["frames_in"] == 0


def test_garbage_file(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    garbage = tmp_path / "camera.mp4"
    garbage.write_bytes(os.urandom(300_000))
    assert_usage_error(vidsentry("run", str(garbage), "--nats-url", nats_server.url), "camera.mp4")


def test_truncated_file(sample_clip: Path, nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    truncated = tmp_path / "cut.mp4"
    truncated.write_bytes(sample_clip.read_bytes()[:150_000])
    proc = vidsentry("run", str(truncated), "--nats-url", nats_server.url, "--json")
    assert_usage_error(proc, "cut.mp4")


def test_unreachable_nats_is_a_runtime_error(sample_clip: Path) -> None:
    proc = vidsentry("run", str(sample_clip), "--nats-url", "nats://127.0.0.1:1", "--duration", "2")
    assert proc.returncode == 1, proc.stderr
    assert "127.0.0.1:1" in proc.stderr and "Traceback" not in proc.stderr


async def collect(url: str, subject: str, into: list[nats.aio.msg.Msg], ready: asyncio.Event) -> None:
    nc = await nats.connect(url)
    try:

        async def append(msg: nats.aio.msg.Msg) -> None:
            into.append(msg)

        await nc.subscribe(subject, cb=append)
        await round_trip(nc)
        ready.set()
        await asyncio.Event().wait()
    finally:
        await nc.close()


async def test_run_publishes_detections_tracks_and_status(sample_clip: Path, nats_server: EmbeddedNatsServer) -> None:
    received: list[nats.aio.msg.Msg] = []
    ready = asyncio.Event()
    listener = asyncio.create_task(collect(nats_server.url, "vidsentry.lobby.>", received, ready))
    await asyncio.wait_for(ready.wait(), 10)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "realtime.cli", "run", str(sample_clip), "--id", "lobby", "--realtime",
        "--duration", "6", "--nats-url", nats_server.url, "--json",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, stderr.decode()
    summary = json.loads(stdout.decode().strip().splitlines()[-1])

    def of_kind(kind: str) -> list[nats.aio.msg.Msg]:
        return [m for m in received if m.subject.rsplit(".", 1)[-1] == kind]

    # What run published may still be on its way to this listener when the process has exited.
    expected = summary["frames_processed"] + summary["frames_predicted"]
    await wait_until(
        lambda: len(of_kind("detections")) >= expected
        and any(json.loads(m.data)["state"] == "stopped" for m in of_kind("status")),
        10, lambda: f"{expected} detections and the stopped status, got {len(of_kind('detections'))}",
    )
    listener.cancel()
    assert summary["state"] == "stopped"
    assert summary["frames_processed"] > 5 and summary["detections"] > 10
    assert summary["audio_seconds"] > 3  # the narration is decoded alongside
    # A live stream's frames the model skipped go out with predicted boxes (skipped ones included).
    handled = ("frames_processed", "frames_predicted", "frames_dropped", "frames_failed")
    accounted = sum(summary[k] for k in handled)
    assert summary["frames_in"] - accounted in (0, 1)  # at most one frame was still in the mailbox at stop

    by_kind: dict[str, list[nats.aio.msg.Msg]] = {}
    for msg in received:
        by_kind.setdefault(msg.subject.rsplit(".", 1)[-1], []).append(msg)
    assert set(by_kind) >= {"detections", "tracks", "status"}
    assert len(by_kind["detections"]) == summary["frames_processed"] + summary["frames_predicted"]
    inference = [json.loads(m.data)["inference"] for m in by_kind["detections"]]
    assert inference.count("measured") == summary["frames_processed"]
    states = [json.loads(m.data)["state"] for m in by_kind["status"]]
    assert states[0] == "connecting" and "live" in states and states[-1] == "stopped"
    for msg in received:
        headers = msg.headers or {}
        kind = msg.subject.rsplit(".", 1)[-1]
        assert headers["ce-specversion"] == "1.0"
        assert headers["ce-type"] == f"io.vidsentry.{kind}.v1"
        assert headers["ce-source"].endswith("/lobby")
        assert headers["Nats-Msg-Id"] == headers["ce-id"]
        body = json.loads(msg.data)
        assert body["stream_id"] == "lobby"
        assert {"pts", "captured_at", "published_at"} <= set(body)
    det = json.loads(by_kind["detections"][-1].data)
    assert det["width"] == 768 and det["height"] == 576 and det["objects"]
    assert {"class", "score", "box", "track_id"} <= set(det["objects"][0])
    track_events = [json.loads(m.data)["event"] for m in by_kind["tracks"]]
    assert "new" in track_events and track_events.count("end") >= 1  # open tracks end at stop


def test_doctor_lists_engines() -> None:
    proc = vidsentry("doctor")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert " yes " in lines["onnxruntime-cpu"]
    assert " no " in lines["tensorrt"] and "pip install" in lines["tensorrt"]


async def test_subscribe_prints_json_lines(nats_server: EmbeddedNatsServer) -> None:
    from pipelines.events import EventKind
    from realtime.bus.publisher import NatsEventPublisher

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "realtime.cli", "subscribe", "vidsentry.door.>", "--nats-url", nats_server.url,
        "--count", "2", "--duration", "30",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    async with NatsEventPublisher(nats_server.url, node="t") as publisher:
        # Keep publishing until the subscriber (a separate process) has seen two events.
        for i in range(200):
            event = any_event(EventKind.DETECTIONS, "door", {"objects": []}, pts=float(i), captured_at=1.7e9)
            await publisher.publish(event)
            await publisher.flush(timeout=2)
            if proc.returncode is not None:
                break
            await asyncio.sleep(0.1)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, stderr.decode()
    lines = [json.loads(line) for line in stdout.decode().splitlines()]
    assert len(lines) == 2
    assert lines[0]["subject"] == "vidsentry.door.detections"
    assert lines[0]["headers"]["ce-type"] == "io.vidsentry.detections.v1"
    assert lines[0]["data"]["stream_id"] == "door"


def test_help_imports_no_command() -> None:
    # `vidsentry --help` builds its parser from plain argparse: no engine, NATS, aiohttp or numpy.
    code = (
        "import sys\n"
        "from realtime.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('numpy', 'onnxruntime', 'av', 'nats', 'aiohttp', 'pydantic', 'engines', 'pipelines')\n"
        "heavy = sorted(m for m in heavy if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "serve" in proc.stdout and "HEAVY []" in proc.stdout, proc.stdout


PRINTED_PIECES = [
    [(" A", 0.0, 0.2), (" man", 0.2, 0.5)], [(" walks", 0.5, 0.9)], [(" past.", 0.9, 1.3)],
    [(" Then", 1.5, 1.7), (" he", 1.7, 1.8)], [(" stops", 1.8, 2.2)],
    [(" Much", 5.0, 5.3), (" later", 5.3, 5.8)],  # after a pause: the unfinished sentence is printed first
]  # fmt: skip
PRINTED_LINES = ["[cam     0.0s] A man walks past.", "[cam     1.5s] Then he stops", "[cam     5.0s] Much later"]


class _Published:
    def __init__(self) -> None:
        self.events: list[object] = []

    async def publish(self, event: object) -> None:
        self.events.append(event)


async def test_the_caption_printer_prints_the_finals_a_line_per_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.captions.printer import SpokenLines
    from pipelines.event_bodies import caption_event
    from realtime.cli.run import EventPrinter

    sink = _Published()
    printer = EventPrinter(sink, [SpokenLines(transcript=False)], quiet=False)
    for seq, words in enumerate(PRINTED_PIECES):
        event = caption_event("cam", segment_id=f"s-{seq}", words=[(w, s, e, 0.9) for w, s, e in words],
                              language="en", model="tiny.en", captured_at=0.0)  # fmt: skip
        await printer.publish(event)
    printer.flush()
    assert capsys.readouterr().out.splitlines() == PRINTED_LINES
    assert len(sink.events) == printer.counts()["captions"] == 6  # every final still goes on to NATS


async def test_with_a_transcript_the_printer_prints_its_sentences_not_the_finals(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pipelines.captions.printer import SpokenLines
    from pipelines.event_bodies import caption_event, transcript_event
    from realtime.cli.run import EventPrinter

    sink = _Published()
    printer = EventPrinter(sink, [SpokenLines()], quiet=False)
    await printer.publish(caption_event("cam", segment_id="s-0", words=[(" A", 0.0, 0.2, 0.9)], language="en",
                                        model="tiny.en", captured_at=0.0))  # fmt: skip
    assert capsys.readouterr().out == ""  # a final alone prints nothing: its transcript will
    # Transcript pieces end where they were cut, sentences inside them or across them.
    flat = [w for words in PRINTED_PIECES for w in words]
    for index, words in enumerate((flat[:4], flat[4:7], flat[7:])):
        timed = [(w, s, e, 0.9) for w, s, e in words]
        event = transcript_event("cam", utterance_id=f"u{index}", replaces=[f"s-{index}"], words=timed,
                                 start=words[0][1], end=words[-1][2], revised=True, changed=True, language="en",
                                 model="tiny.en", captured_at=0.0)  # fmt: skip
        await printer.publish(event)
    printer.flush()
    assert capsys.readouterr().out.splitlines() == PRINTED_LINES
    assert printer.counts()["captions"] == 1 and len(sink.events) == 4


async def test_what_run_prints_of_a_speaker_who_does_not_pause_is_whole_sentences(
    caption_models: tuple[SpeechRecognizer, VadModel], sample_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sample's narration (its sentence pauses are shorter than an endpoint: one utterance)
    through a caption stage, printed as `vidsentry run` prints it: a line per sentence, punctuated,
    every sentence there."""
    from pipelines.captions.printer import SpokenLines
    from realtime.cli.run import EventPrinter

    recognizer, vad = caption_models
    narration = load_pcm16k(sample_dir / "narration.wav", seconds=22.0)
    async with SpeechBatcher(recognizer) as batcher:
        # At live pace: the stage steers its windows by its lag, so speech fed faster than real
        # time reads as falling behind and its lines would depend on the machine's load.
        sink = await caption(CaptionEngine(batcher, vad, CaptionPolicy()), narration, speed=1.0)
    printer = EventPrinter(Collect(), [SpokenLines()], quiet=False)
    for event in sink.events:
        await printer.publish(event)
    printer.flush()
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert len(lines) >= 4 and all(line.endswith((".", "?", "!")) for line in lines[:-1]), lines
    assert all(len(line.split()) < LINE_MAX_WORDS for line in lines), lines  # sentences, not run-on pieces
    assert script_prefix_wer(" ".join(lines)) <= 0.2, lines


def test_the_summary_says_what_the_compute_budget_decided() -> None:
    from pipelines.compute import ComputeBudget, ModelClaim, Priority
    from realtime.cli.run import compute_summary

    assert compute_summary(None, 10.0) is None
    budget = ComputeBudget(2, {"detector": ModelClaim(), "speech recognizer": ModelClaim(Priority.CRITICAL)})
    with budget.turn("detector") as threads:
        assert threads == 1
    state = compute_summary(budget, 10.0)
    assert state is not None and state["cores"] == 2
    detector = state["models"]["detector"]
    assert detector["turns"] == 1 and detector["priority"] == "bulk" and 0 <= detector["busy_share"] < 0.01
    assert state["models"]["speech recognizer"]["turns"] == 0
