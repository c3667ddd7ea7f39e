"""Captions in other languages, live: the multilingual Whisper base with `captions.language: auto`
and (optionally) `captions.translate: en`, through the real service, on synthesized speech.

Per language (espeak-ng voices; the sentences and their English of tests/support/languages.py,
said one after another with a pause after each), each as an RTSP camera (the GStreamer RTSP test
server playing an mp4 of grey frames and the speech) and as a browser peer (an aiortc peer sending
the speech, then silence): the service runs in this process (tests/support/service.py, the default
compute budget, the nudenet 320n detector on one thread as the tests use it), its events read from
NATS. Figures per run:
  - language_accuracy: transcripts (one per utterance or piece) whose `language` is the one spoken;
  - wer_vs_offline: the transcripts' words joined against the same model's offline decode of the same
    sentences (each decoded whole, language detected); cer_vs_offline beside it (letters and digits
    of any script, spaces and punctuation left out); for a language written without spaces (ja)
    words do not split, and `error_vs_offline` (the figure to read) is the CER;
  - caption_lag p50/p95: a final's arrival on NATS after its last word was heard (`captured_at`);
  - chrF of the English track (`translations`, joined) against the reference English, and its lag
    (arrival after the transcript's speech ended);
  - detect_fps: frames the detector ran on, a second, over the run (frames_processed; the frames
    the tracker's prediction answered while the cores were the recognizer's are frames_predicted);
    the clip and the peer send 5 fps.
--streams N runs N RTSP cameras of the first language at once (with and without translation when
--translate both): audio dropped (`audio_dropped_seconds`), transcripts that kept their finals and
translations missed say where a 2-core machine stops keeping pace. --mixed runs two streams that
chose their own captions (docs/captions.md): an English camera on the service's tiny.en beside a
camera of the first language naming Whisper base, `language: auto` and the English track for
itself, so two models serve one machine's streams side by side.

    python bench/bench_languages.py [--languages es,fr,de,ja] [--sentences 3] [--translate on|off|both]
                                    [--streams 1,2,3] [--skip-peers] [--mixed | --only-mixed]

Prints a table; writes bench/results/languages.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engines.asr.types import AsrRequest  # noqa: E402
from engines.asr.vad import VadModel  # noqa: E402
from engines.asr.whisper import create_recognizer  # noqa: E402
from engines.asr.words import NO_SPACE_LANGUAGES  # noqa: E402
from engines.models import nudenet_model_path  # noqa: E402
from engines.registry import create_detector  # noqa: E402
from realtime.bus.embedded import EmbeddedNatsServer  # noqa: E402
from tests.support.languages import PAUSE_S, SENTENCES, speech_clip, synthesize  # noqa: E402
from tests.support.peer import connect  # noqa: E402
from tests.support.rtsp import RtspServer  # noqa: E402
from tests.support.service import LiveService, live_service, make_config  # noqa: E402
from tests.support.speech import edit_distance, words_of  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TAIL_S = 20.0  # after the speech: the last transcript and its translation come this long after, at most
LEAD_S = 1.0


def error_rate(ref: list[str], hyp: list[str]) -> float:
    return edit_distance(ref, hyp) / max(1, len(ref))


def characters(text: str) -> list[str]:
    """The letters and digits of any script, lower-cased: what a CER counts (words_of keeps a-z only)."""
    return [ch for ch in text.lower() if ch.isalnum()]


def chrf(reference: str, hypothesis: str, n: int = 6, beta: float = 2.0) -> float:
    """chrF (character n-grams 1..6, recall weighted twice), 0-100, spaces removed as sacrebleu does."""
    ref, hyp = "".join(reference.lower().split()), "".join(hypothesis.lower().split())
    precisions, recalls = [], []
    for k in range(1, n + 1):
        r = Counter(ref[i : i + k] for i in range(len(ref) - k + 1))
        h = Counter(hyp[i : i + k] for i in range(len(hyp) - k + 1))
        if not r or not h:
            continue
        common = sum((r & h).values())
        precisions.append(common / sum(h.values()))
        recalls.append(common / sum(r.values()))
    if not precisions:
        return 0.0
    p, r = statistics.mean(precisions), statistics.mean(recalls)
    return 0.0 if p + r == 0 else 100 * (1 + beta**2) * p * r / (beta**2 * p + r)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def wall(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Speech:
    """One language's sentences as audio, and what they say."""

    def __init__(self, language: str, count: int) -> None:
        self.language = language
        pairs = SENTENCES[language][:count]
        self.sentences = [synthesize(text, language) for text, _ in pairs]
        self.texts = [text for text, _ in pairs]
        self.english = " ".join(english for _, english in pairs)
        gap = np.zeros(int(PAUSE_S * 16_000), np.float32)
        parts = [np.zeros(int(LEAD_S * 16_000), np.float32)]
        for sentence in self.sentences:
            parts += [sentence, gap]
        self.audio = np.concatenate(parts)

    @property
    def seconds(self) -> float:
        return len(self.audio) / 16_000


class Collected:
    def __init__(self) -> None:
        self.events: dict[str, list[tuple[float, dict[str, Any]]]] = {}

    async def start(self, url: str, stream_id: str) -> nats.NATS:
        nc = await nats.connect(url)

        async def on_message(msg: Any) -> None:
            kind = msg.subject.rsplit(".", 1)[1]
            self.events.setdefault(kind, []).append((time.time(), json.loads(msg.data)))

        await nc.subscribe(f"vidsentry.{stream_id}.>", cb=on_message)
        return nc

    def of(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return self.events.get(kind, [])


def figures(speech: Speech, got: Collected, offline: str, counters: dict[str, Any], seconds: float) -> dict[str, Any]:
    transcripts = [b for _, b in got.of("transcript")]
    translations = got.of("translations")
    heard = " ".join(str(b["text"]) for b in transcripts)
    english = " ".join(str(b["text"]) for _, b in translations)
    lags = [at - wall(b["captured_at"]) for at, b in got.of("captions")]
    translation_lags = [at - wall(b["captured_at"]) for at, b in translations]
    wer = round(error_rate(words_of(offline), words_of(heard)), 3)
    cer = round(error_rate(characters(offline), characters(heard)), 3)
    no_spaces = speech.language in NO_SPACE_LANGUAGES
    return {
        "language": speech.language,
        "utterances": len(transcripts),
        "language_accuracy": round(sum(b["language"] == speech.language for b in transcripts) / len(transcripts), 3)
        if transcripts else None,
        "languages_heard": dict(Counter(str(b["language"]) for b in transcripts)),
        "wer_vs_offline": wer,
        "cer_vs_offline": cer,
        "error_vs_offline": cer if no_spaces else wer,
        "error_kind": "cer" if no_spaces else "wer",
        "wer_vs_script": round(error_rate(words_of(" ".join(speech.texts)), words_of(heard)), 3),
        # Against the sentences as written: where the offline decode wrote another script (kanji or
        # Latin letters for kana), the CER against it says little.
        "cer_vs_script": round(error_rate(characters(" ".join(speech.texts)), characters(heard)), 3),
        "caption_lag_p50": pct(lags, 0.5),
        "caption_lag_p95": pct(lags, 0.95),
        "translations": len(translations),
        "chrf": round(chrf(speech.english, english), 1) if translations else None,
        "translation_lag_p50": pct(translation_lags, 0.5),
        "translation_lag_p95": pct(translation_lags, 0.95),
        "detect_fps": round(counters.get("frames_processed", 0) / seconds, 2),
        "frames_predicted": counters.get("frames_predicted"),
        "audio_dropped_s": counters.get("audio_dropped_seconds"),
        "transcripts_kept_finals": counters.get("transcripts_kept_finals"),
        "translations_missed": counters.get("translations_missed"),
        "load_1m": round(os.getloadavg()[0], 1),  # the machine's load as the run ended (2 cores shared)
        "counters": counters,
        "heard": heard[:300],
        "english": english[:300],
    }


async def run_camera(
    svc: LiveService, nats_url: str, speeches: list[Speech], tmp: Path, own: list[dict[str, Any] | None] | None = None
) -> list[dict[str, Any]]:
    """One RTSP camera per speech, at once (`own`: each stream's own captions settings, if any)."""
    # Silence after the speech for the whole wait: the server plays the clip once, and a stream that
    # ended would be reconnected and hear the speech again within the wait.
    tail = np.zeros(int((TAIL_S + 10) * 16_000), np.float32)
    clips = {sp.language: speech_clip(tmp / f"{sp.language}.mp4", np.concatenate([sp.audio, tail])) for sp in speeches}
    servers = [RtspServer(clip=clips[sp.language], log_path=tmp / f"rtsp{i}.log").start()
               for i, sp in enumerate(speeches)]
    collected = [Collected() for _ in speeches]
    ncs = [await c.start(nats_url, f"cam{i}") for i, c in enumerate(collected)]
    try:
        started = time.monotonic()
        for i, server in enumerate(servers):
            body: dict[str, Any] = {"id": f"cam{i}", "url": server.url("/vtest")}
            if own is not None and own[i] is not None:
                body["captions"] = own[i]
            reply = await svc.call("POST", "/api/streams", json_body=body)
            assert reply.status == 201, reply
        await asyncio.sleep(max(sp.seconds for sp in speeches) + TAIL_S)
        seconds = time.monotonic() - started
        counters = [(await svc.stream(f"cam{i}"))["counters"] for i in range(len(speeches))]
        for i in range(len(speeches)):
            await svc.call("DELETE", f"/api/streams/cam{i}")
    finally:
        for nc in ncs:
            await nc.close()
        for server in servers:
            server.close()
    pairs = zip(counters, collected, strict=True)
    return [{"source": "rtsp", "counters": c, "seconds": seconds, "got": g} for c, g in pairs]


async def run_mixed(
    models: tuple[Any, Any], vad: VadModel, nats_url: str, tmp: Path, speeches: list[Speech], *, translate: bool
) -> list[dict[str, Any]]:
    """Streams choosing their own models in one service: the section's tiny.en in English for the
    first speech (English), Whisper base with `language: auto` (and the English track) for the
    others, each naming it (`captions: {model: base, ...}`). `models`: (base, tiny.en), loaded."""
    recognizer, tiny = models
    detector = create_detector(nudenet_model_path(), "onnx-cpu", threads=1)
    own: list[dict[str, Any] | None] = [None] + [
        {"model": "base", "language": "auto", "translate": "en" if translate else "off"} for _ in speeches[1:]
    ]
    try:
        async with live_service(detector, nats_url, config=make_config(), captions=(tiny, vad),
                                more_models={"base": recognizer}) as svc:
            return await run_camera(svc, nats_url, speeches, tmp, own)
    finally:
        detector.close()


async def run_peer(svc: LiveService, nats_url: str, speech: Speech) -> dict[str, Any]:
    silence = np.zeros(int((TAIL_S + 30) * 16_000), np.float32)
    # the peer sends 48 kHz s16, as a browser's Opus track decodes
    audio48 = (np.clip(np.repeat(np.concatenate([speech.audio, silence]), 3), -1, 1) * 32767).astype(np.int16)
    grey = [np.full((120, 160, 3), 96, np.uint8)]
    got = Collected()
    import aiohttp

    async with aiohttp.ClientSession() as http:
        peer = await connect(http, svc.url, frames=grey, speech=audio48, fps=5)
        nc = await got.start(nats_url, peer.stream_id)
        started = time.monotonic()
        try:
            await asyncio.sleep(speech.seconds + TAIL_S)
            counters = (await svc.stream(peer.stream_id))["counters"]
        finally:
            await nc.close()
            await peer.close()
    return {"source": "peer", "counters": counters, "seconds": time.monotonic() - started, "got": got}


@contextlib.asynccontextmanager
async def service(recognizer: Any, vad: VadModel, nats_url: str, translate: bool) -> AsyncIterator[LiveService]:
    detector = create_detector(nudenet_model_path(), "onnx-cpu", threads=1)
    captions: dict[str, Any] = {"model": "base", "language": "auto", "translate": "en" if translate else None}
    config = make_config(captions=captions)
    try:
        async with live_service(detector, nats_url, config=config, captions=(recognizer, vad)) as svc:
            yield svc
    finally:
        detector.close()


async def main_async(args: argparse.Namespace) -> int:
    languages = args.languages.split(",")
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.translate]
    recognizer = create_recognizer("base", language=None, threads=min(4, os.cpu_count() or 1))
    vad = VadModel.load()
    speeches = {lang: Speech(lang, args.sentences) for lang in languages}
    offline = {
        lang: " ".join(r.text for r in recognizer.transcribe_batch([AsrRequest(s) for s in sp.sentences]))
        for lang, sp in speeches.items()
    }
    rows: list[dict[str, Any]] = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        bus = EmbeddedNatsServer(store_dir=tmp / "nats")
        bus.start()
        for translate in modes if not args.only_mixed else []:
            async with service(recognizer, vad, bus.url, translate) as svc:
                for lang, speech in speeches.items():
                    runs = await run_camera(svc, bus.url, [speech], tmp)
                    if not args.skip_peers:
                        runs.append(await run_peer(svc, bus.url, speech))
                    for run in runs:
                        row = figures(speech, run["got"], offline[lang], run["counters"], run["seconds"])
                        rows.append({"streams": 1, "source": run["source"], "translate": translate, **row})
                        print(json.dumps(rows[-1], ensure_ascii=False), flush=True)
                for count in [int(n) for n in args.streams.split(",") if n and int(n) > 1]:
                    speech = speeches[languages[0]]
                    for i, run in enumerate(await run_camera(svc, bus.url, [speech] * count, tmp)):
                        row = figures(speech, run["got"], offline[languages[0]], run["counters"], run["seconds"])
                        rows.append({"streams": count, "stream": i, "source": "rtsp", "translate": translate, **row})
                        print(json.dumps(rows[-1], ensure_ascii=False), flush=True)
        if args.mixed or args.only_mixed:
            tiny = create_recognizer(threads=min(4, os.cpu_count() or 1))
            english = Speech("en", args.sentences)
            heard = " ".join(r.text for r in tiny.transcribe_batch([AsrRequest(s) for s in english.sentences]))
            offline["en (tiny.en)"] = heard
            mixed = [english, speeches[languages[0]]]
            for translate in modes:
                runs = await run_mixed((recognizer, tiny), vad, bus.url, tmp, mixed, translate=translate)
                for speech, run in zip(mixed, runs, strict=True):
                    said = heard if speech is english else offline[speech.language]
                    row = figures(speech, run["got"], said, run["counters"], run["seconds"])
                    rows.append({"streams": "mixed", "source": "rtsp", "translate": translate and speech is not english,
                                 "model": "tiny.en" if speech is english else "base", **row})
                    print(json.dumps(rows[-1], ensure_ascii=False), flush=True)
            tiny.close()
        bus.stop()
    recognizer.close()
    columns = ["streams", "source", "translate", "language", "utterances", "language_accuracy", "error_kind",
               "error_vs_offline", "cer_vs_offline", "cer_vs_script", "caption_lag_p50", "caption_lag_p95", "chrf",
               "translation_lag_p50", "translation_lag_p95", "detect_fps", "audio_dropped_s", "transcripts_kept_finals",
               "translations_missed", "load_1m"]
    print("\n" + " | ".join(columns))
    for row in rows:
        print(" | ".join(str(row.get(c)) for c in columns))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "languages.json"
    out.write_text(json.dumps({"load_at_start": load, "cpus": os.cpu_count(), "offline": offline, "rows": rows},
                              indent=2, ensure_ascii=False))
    print(f"\nwrote {out} (load average at start {load[0]:.1f} on {os.cpu_count()} CPUs)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--languages", default="es,fr,de,ja")
    parser.add_argument("--sentences", type=int, default=3)
    parser.add_argument("--translate", choices=["on", "off", "both"], default="on")
    parser.add_argument("--streams", default="1", help="comma list; counts over 1 run that many RTSP cameras at once")
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--mixed", action="store_true",
                        help="also: an English camera on the section's tiny.en beside one of the first language naming "
                             "base for itself (captions: {model: base, ...}), two models in one service")
    parser.add_argument("--only-mixed", action="store_true", help="the mixed run alone")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
