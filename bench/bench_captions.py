"""Live captions on real-time audio: word emission latency, streaming vs offline WER, concurrent
streams, and captions beside the detector.

Audio: the espeak-ng narration (samples/narration.txt, 50 s) with 0.5 s of silence before and 2 s
after, fed in 20 ms chunks at real-time speed (asyncio.sleep against a monotonic schedule) through
the production path: AudioBuffer -> CaptionStage (Silero VAD, LocalAgreement) -> one shared
SpeechBatcher -> tiny.en int8 on CTranslate2 (window "audio", its default threads, as the service).

Word end times (the reference): the narration transcribed offline by the same model with the stock
30 s padded window, on pieces of at most 28 s cut at VAD pauses, each prompted with the text before
it; a word ends at its DTW alignment time. The same transcript is the offline side of the WER
comparison. The ends are checked against the VAD: at each pause, the DTW end of the last word before it minus
the time the speech probability fell ("alignment check"); an end inside a pause is moved back to
the pause's start.

Emission latency of a word = monotonic time its event reached the sink - time the chunk holding the
word's end was due in the real-time schedule (feed lateness is printed too). Streamed words are
matched to reference words by normalised text and time, as the longest common subsequence under
those constraints: final words by their own times (within 1 s), partials (text and span only) among
the reference words within 1 s of the span. "first partial": the first partial holding the word;
words that went straight to a final count in "first shown" (first partial or final) only.
Partial edits (flicker): the display is the finals so far plus the current partial; an update erases
the words of the previous display that are not a prefix of the new one. edit_pct = updates that
erased a word / updates; erased_per_word = erased words / final words.

Parts (--parts, default all):
  latency   one stream, the narration: latency p50/p90 of finals and first partials, edits, and
            streaming WER (the finals) - offline WER, both against the script. Targets: finals p50
            <= 1.0 s, first partials p50 <= 0.5 s, WER difference <= +2 points. Run --repeat times
            (default 2): which words get committed depends on when the decodes land, so it varies.
  wer       streaming WER - offline WER on the speech set (bench/_speech_set.py: the narration and
            nine espeak-ng clips of six texts in other voices and speeds, ~1,300 words), the stage
            fed in file mode (its decodes land where a live stream's do while the recognizer keeps
            up). Target: <= +2 points over the whole set.
  streams   N streams at once (--streams), each a different --stream-seconds slice of the narration
            cut at pauses, one SpeechBatcher with max_batch 8 (cross-stream batching) and 1 (none).
            Real-time: no audio dropped, finals p90 <= 3 s, and a backlog (audio waiting in the
            streams' buffers, least-squares line over the speech) that grows by <= 0.5 s. For each
            max_batch, N stops growing once it is clearly behind (audio dropped or finals p90 > 6 s).
            Target: >= 6 streams. window_mean_s: sampled length of the audio windows being decoded;
            speech_per_decode_s: speech seconds per decode (step_s while the recognizer keeps up).
  detector  one stream's latency (the latency part's audio) while the default detector runs on
            vtest frames at the camera's 10 fps (latest frame wins) through a DetectionBatcher in the
            same process, without and with the compute budget (pipelines.compute); detector fps in each, and
            alone. `by_age`: the streaming decodes' window and call time in 10 s bins of how long the
            narrator had been talking (it never pauses long enough to end its utterance): flat, because the
            window is bounded whatever the utterance's length.
Single runs on a shared 2-core machine: compare rows within one run.

Usage: .venv/bin/python bench/bench_captions.py [--parts latency,wer,streams,detector] [--seconds 50]
       [--repeat 2] [--stream-seconds 20] [--streams 1,2,4,6,8] [--batches 8,1] [--step-s S] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from _common import ROOT, decode_frames, ensure_sample, pct, peak_rss_mb, table, write_results
from _speech_set import SpeechClip, speech_set, stream_file

from engines.asr.types import AsrRequest, AsrResult, SpeechRecognizer
from engines.asr.vad import StreamVad, VadModel
from engines.asr.whisper import create_recognizer
from engines.models import default_detector_model
from engines.registry import create_detector
from pipelines.captions.config import DEFAULT_BEAM_SIZE
from pipelines.captions.engine import RECOGNIZER, CaptionEngine, CaptionPolicy, SpeechBatcher, recognizer_claim
from pipelines.captions.stage import CaptionStage
from pipelines.compute import ComputeBudget
from pipelines.detect import DETECTOR, DetectionBatcher, detector_claim
from pipelines.events import Event, EventKind
from pipelines.frames import AudioChunk, VideoFrame
from pipelines.mailbox import AudioBuffer, FrameMailbox
from tests.support.speech import load_pcm16k, script, script_prefix_wer, wer, words_of

NARRATION = ROOT / ".cache" / "samples" / "narration.wav"
VTEST = ROOT / ".cache" / "samples" / "vtest.avi"
RATE = 16_000
CHUNK = 320  # 20 ms, as RTP audio arrives
CHUNK_S = CHUNK / RATE
LEAD_S = 0.5  # silence before each clip
TRAIL_S = 2.0  # silence after it, so the last utterance ends by endpointing as it would live
MAX_PIECE_S = 28.0  # offline pieces stay inside Whisper's 30 s window
PAUSE_PROB = 0.35  # VAD probability under which a 32 ms window is a pause
PAUSE_WINDOWS = 5  # windows in a row (160 ms) that make a pause
MATCH_TOL_S = 1.0
BURST_S = 0.005  # a final and the partial after it come from one publish: one display update
REALTIME_FINAL_P90_S = 3.0
BACKLOG_GROWTH_S = 0.5
SAMPLE_EVERY_S = 0.1
CAMERA_FPS = 10.0  # vtest.avi's rate
CPU_SHARE = 0.75  # the compute budget's bound on captions (compute.captions_max_share)
DETECTOR_ALONE_S = 8.0
SETTINGS = CaptionPolicy()  # the service's defaults; --step-s changes the latency/accuracy knob


# -- the reference ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RefWord:
    key: str  # normalised (tests.support.speech.words_of)
    start: float  # seconds
    end: float


@dataclass(slots=True)
class Reference:
    words: list[RefWord]  # narration time
    text: str  # the offline transcript
    pauses: list[tuple[float, float]]  # VAD pauses (start, end), narration time
    alignment_error: list[float]  # per pause: DTW end of the word before it - VAD start of the pause


def vad_pauses(audio: np.ndarray, vad: VadModel) -> list[tuple[float, float]]:
    stream = StreamVad(vad)
    quiet = [*(stream.process(audio) < PAUSE_PROB).tolist(), False]
    step = stream.window / RATE
    pauses, begun = [], None
    for i, q in enumerate(quiet):
        if q and begun is None:
            begun = i
        elif not q and begun is not None:
            if i - begun >= PAUSE_WINDOWS:
                pauses.append((begun * step, i * step))
            begun = None
    return pauses


def offline_reference(recognizer: SpeechRecognizer, audio: np.ndarray, vad: VadModel) -> Reference:
    pauses = vad_pauses(audio, vad)
    centres = [(a + b) / 2 for a, b in pauses]
    length = len(audio) / RATE
    words: list[RefWord] = []
    texts: list[str] = []
    start = 0.0
    while start < length - 0.1:
        fits = [c for c in centres if start < c <= start + MAX_PIECE_S]
        end = length if length - start <= MAX_PIECE_S else (max(fits) if fits else start + MAX_PIECE_S)
        piece = audio[int(start * RATE) : int(end * RATE)]
        result = recognizer.transcribe_batch([AsrRequest(piece, prompt=" ".join(texts))])[0]
        texts.append(result.text)
        for w in result.words:
            words += [RefWord(key, start + w.start, start + w.end) for key in words_of(w.word)]
        start = end
    # DTW lets a word before a pause run into it: the word before each pause is checked against the
    # VAD's start of the pause, and an end inside the pause (or < 0.5 s past it) is moved back to its start.
    errors = []
    for begun, ended in pauses:
        before = [i for i, w in enumerate(words) if w.start < begun]
        if not before or begun < 0.2:
            continue
        last = before[-1]
        errors.append(round(words[last].end - begun, 3))
        for i in before[-3:]:  # the word before the pause, and keys split from it (same times)
            if begun < words[i].end <= ended + 0.5:
                words[i] = RefWord(words[i].key, words[i].start, begun)
    return Reference(words, " ".join(texts), pauses, errors)


@dataclass(slots=True)
class Clip:
    name: str
    samples: np.ndarray  # 16 kHz, lead and trail silence included
    refs: list[RefWord]  # clip time (0 = the clip's first sample)
    first: float  # narration seconds where the speech part begins
    last: float


def make_clip(name: str, audio: np.ndarray, ref: Reference, first: float, last: float) -> Clip:
    lead, trail = np.zeros(int(LEAD_S * RATE), np.float32), np.zeros(int(TRAIL_S * RATE), np.float32)
    samples = np.concatenate((lead, audio[int(first * RATE) : int(last * RATE)], trail))
    refs = [
        RefWord(w.key, LEAD_S + w.start - first, LEAD_S + w.end - first)
        for w in ref.words
        if w.start >= first - 0.05 and w.end <= last + 0.05
    ]
    return Clip(name, samples, refs, first, last)


def nearest_pause(ref: Reference, t: float, length: float) -> float:
    """The pause centre nearest `t` (or the narration's end when that is nearer)."""
    centres = [(a + b) / 2 for a, b in ref.pauses] + [length]
    return min(centres, key=lambda c: abs(c - t))


# -- running streams ----------------------------------------------------------------------------


class TimedSink:
    """Events with the monotonic time they were handed over."""

    def __init__(self) -> None:
        self.events: list[tuple[float, Event]] = []

    async def publish(self, event: Event) -> None:
        self.events.append((time.monotonic(), event))


@dataclass(slots=True)
class Stream:
    clip: Clip
    buffer: AudioBuffer
    sink: TimedSink
    stage: CaptionStage
    t0: float = 0.0  # chunk k is due at t0 + (k + 1) * CHUNK_S

    def due(self, clip_time: float) -> float:
        """When the chunk holding clip time `clip_time` was due in the real-time schedule."""
        return self.t0 + max(1, math.ceil(clip_time / CHUNK_S - 1e-9)) * CHUNK_S


class CameraLoad:
    """The detector at a camera's rate: frames every 1/fps into a latest-wins mailbox, detected in turn."""

    def __init__(self, batcher: DetectionBatcher, frames: list[np.ndarray], fps: float = CAMERA_FPS) -> None:
        self.batcher, self.frames, self.fps = batcher, frames, fps
        self.processed = 0
        self.mailbox: FrameMailbox | None = None

    async def run(self) -> None:
        self.mailbox = FrameMailbox()
        consumer = asyncio.create_task(self._detect(self.mailbox))
        try:
            started, seq = time.monotonic(), 0
            while True:
                image = self.frames[seq % len(self.frames)]
                self.mailbox.put(VideoFrame("cam", seq, seq / self.fps, time.time(), image))
                seq += 1
                await asyncio.sleep(max(0.0, started + seq / self.fps - time.monotonic()))
        finally:
            self.mailbox.close()
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer

    async def _detect(self, mailbox: FrameMailbox) -> None:
        while True:
            frame = await mailbox.get()
            await self.batcher.detect(frame.image)
            self.processed += 1

    @property
    def dropped(self) -> int:
        return self.mailbox.stats.dropped if self.mailbox else 0


@dataclass(slots=True)
class Run:
    streams: list[Stream]
    seconds: float  # feeding time
    lateness: list[float]  # how late each feed tick was (s)
    backlog: list[tuple[float, float]]  # (seconds since t0, the largest audio backlog among the streams)
    windows: list[float]  # sampled durations of the audio windows being decoded (s)
    batch_calls: int
    batch_items: int
    asr_busy_s: float
    detector_fps: float | None = None
    detector_dropped: int | None = None
    turns: dict[str, dict[str, float]] | None = None  # ComputeBudget over the feeding time, per model
    stages_ms: dict[str, float] | None = None  # the recognizer's time per call, by stage (features, encode, ...)
    unfinished: int = 0  # stages still running after the drain timeout
    by_age: list[dict[str, Any]] = field(default_factory=list)  # decode cost against the utterance's age


async def feed(streams: list[Stream], t0: float, lateness: list[float]) -> None:
    chunks = [len(s.clip.samples) // CHUNK for s in streams]
    for k in range(max(chunks)):
        due = t0 + (k + 1) * CHUNK_S
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        lateness.append(time.monotonic() - due)
        wall = time.time()
        for stream, count in zip(streams, chunks, strict=True):
            if k < count:
                samples = stream.clip.samples[k * CHUNK : (k + 1) * CHUNK]
                stream.buffer.put(AudioChunk(stream.stage.stream_id, k * CHUNK_S, wall, samples))


async def sample_backlog(
    streams: list[Stream], t0: float, into: list[tuple[float, float]], windows: list[float]
) -> None:
    """The audio waiting in the streams' buffers, and how long the windows being decoded are."""
    idle = SETTINGS.pre_roll_s + 0.05  # a window no longer than the pre-roll: nobody speaks
    while True:
        await asyncio.sleep(SAMPLE_EVERY_S)
        into.append((time.monotonic() - t0, max(s.buffer.buffered_seconds for s in streams)))
        windows += [s.stage.window.duration for s in streams if s.stage.window.duration > idle]


async def run_streams(
    recognizer: SpeechRecognizer,
    vad: VadModel,
    clips: Sequence[Clip],
    *,
    max_batch: int,
    compute: ComputeBudget | None = None,
    load: CameraLoad | None = None,
) -> Run:
    settings = SETTINGS
    profiled = ProfiledRecognizer(recognizer)
    async with SpeechBatcher(profiled, max_batch=max_batch, compute=compute) as batcher:
        engine = CaptionEngine(batcher, vad, settings)
        streams = []
        for i, clip in enumerate(clips):
            buffer = AudioBuffer(max_seconds=settings.max_lag_s)  # as the service gives a live stream
            sink = TimedSink()
            streams.append(Stream(clip, buffer, sink, CaptionStage(f"s{i}", buffer, engine, sink, live=True)))
        tasks = [asyncio.create_task(s.stage.run()) for s in streams]
        load_task = asyncio.create_task(load.run()) if load else None
        if load:
            await asyncio.sleep(1.0)  # the detector is busy before the first word
        lateness: list[float] = []
        backlog: list[tuple[float, float]] = []
        t0 = time.monotonic()
        windows: list[float] = []
        sampler = asyncio.create_task(sample_backlog(streams, t0, backlog, windows))
        for s in streams:
            s.t0 = t0
        processed = load.processed if load else 0
        shares_before = _turn_stats(compute)
        await feed(streams, t0, lateness)
        seconds = time.monotonic() - t0
        turns = None
        if compute is not None:
            after = _turn_stats(compute)
            turns = {
                name: {
                    "cpu_pct": round(100 * (after[name][0] - before[0]) / seconds, 1),
                    "wait_ms_per_turn": round(1000 * (after[name][1] - before[1]) / max(1, after[name][2] - before[2])),
                }
                for name, before in shares_before.items()
            }
        detector_fps = (load.processed - processed) / seconds if load else None
        sampler.cancel()
        for s in streams:
            s.buffer.close()
        _, pending = await asyncio.wait(tasks, timeout=30)
        for task in pending:
            task.cancel()
        if load_task:
            load_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load_task
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        return Run(
            streams,
            seconds,
            lateness,
            backlog,
            windows,
            batcher.stats.calls,
            batcher.stats.items,
            batcher.stats.busy_s,
            detector_fps=None if detector_fps is None else round(detector_fps, 2),
            detector_dropped=load.dropped if load else None,
            turns=turns,
            unfinished=len(pending),
            stages_ms=profiled.per_call(),
            by_age=decodes_by_age(profiled.log, t0 + LEAD_S),
        )


AGE_BIN_S = 10.0


def decodes_by_age(log: list[tuple[float, float, list[float]]], speech0: float) -> list[dict[str, Any]]:
    """The streaming decodes' window and call time against how long the speaker had been talking
    when the call began, in bins of AGE_BIN_S: flat when the window is bounded whatever the
    utterance's length. The age is the time since the clip's speech began (one utterance: the
    narration never pauses long enough to end one; with pauses, an upper bound)."""
    bins: dict[int, list[tuple[float, float]]] = {}
    for began, ms, windows in log:
        if began >= speech0:
            bins.setdefault(int((began - speech0) // AGE_BIN_S), []).extend((w, ms) for w in windows)
    return [
        {
            "age_s": f"{k * AGE_BIN_S:g}-{(k + 1) * AGE_BIN_S:g}",
            "decodes": len(v),
            "window_mean_s": round(float(np.mean([w for w, _ in v])), 2),
            "window_max_s": round(max(w for w, _ in v), 2),
            "call_mean_ms": round(float(np.mean([ms for _, ms in v]))),
            "call_p90_ms": pct([ms for _, ms in v], 90),
        }
        for k, v in sorted(bins.items())
    ]


class ProfiledRecognizer:
    """The recognizer, adding up its `last_timings` (stage times of each call) when it has them."""

    def __init__(self, inner: SpeechRecognizer) -> None:
        self.inner = inner
        self.info = inner.info
        self.workers = inner.workers
        self.calls = 0
        self.totals: dict[str, float] = {}
        # Per call: (monotonic time it began, its wall ms, the seconds of audio of each streaming
        # decode in it; a transcript's decode asks for its own beam and is left out)
        self.log: list[tuple[float, float, list[float]]] = []

    def transcribe_batch(self, requests: Sequence[AsrRequest]) -> list[AsrResult]:
        began = time.monotonic()
        results = self.inner.transcribe_batch(requests)
        streaming = [r.audio.shape[0] / RATE for r in requests if r.beam_size is None]
        if streaming:
            self.log.append((began, 1000 * (time.monotonic() - began), streaming))
        self.calls += 1
        for key, value in getattr(self.inner, "last_timings", {}).items():
            if key.endswith("_ms") or key == "frames":
                self.totals[key] = self.totals.get(key, 0.0) + value
        return results

    def close(self) -> None:
        self.inner.close()

    def per_call(self) -> dict[str, float]:
        return {k: round(v / max(1, self.calls), 1) for k, v in self.totals.items()}


def _turn_stats(compute: ComputeBudget | None) -> dict[str, tuple[float, float, int]]:
    if compute is None:
        return {}
    return {name: (st.busy_s, st.wait_s, st.turns) for name, st in compute.stats.items()}


# -- scoring ------------------------------------------------------------------------------------


def lcs(n: int, m: int, same: Callable[[int, int], bool]) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of two sequences under `same`."""
    table_ = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = table_[i], table_[i + 1]
        for j in range(m - 1, -1, -1):
            row[j] = below[j + 1] + 1 if same(i, j) else max(below[j], row[j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if same(i, j) and table_[i][j] == table_[i + 1][j + 1] + 1:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif table_[i + 1][j] >= table_[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


@dataclass(slots=True)
class Score:
    final_s: list[float] = field(default_factory=list)
    partial_s: list[float] = field(default_factory=list)
    shown_s: list[float] = field(default_factory=list)
    ref_words: int = 0
    final_words: int = 0
    updates: int = 0
    revised: int = 0
    erased: int = 0
    finals_text: list[str] = field(default_factory=list)

    def add(self, other: Score) -> None:
        for f in fields(Score):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def score(stream: Stream) -> Score:
    refs, events = stream.clip.refs, stream.sink.events
    out = Score(ref_words=len(refs))
    finals = [(at, e) for at, e in events if e.kind == EventKind.CAPTIONS]
    hyp = [(key, float(w["end"]), at) for at, e in finals for w in e.data["words"] for key in words_of(w["word"])]
    final_at: dict[int, float] = {}
    for i, j in lcs(len(refs), len(hyp), lambda i, j: _same_final(refs[i], hyp[j])):
        final_at[i] = hyp[j][2]
    partial_at: dict[int, float] = {}
    for at, e in events:
        if e.kind != EventKind.PARTIALS:
            continue
        said = words_of(str(e.data["text"]))
        lo, hi = float(e.data["start"]) - MATCH_TOL_S, float(e.data["end"]) + MATCH_TOL_S
        near = [i for i, w in enumerate(refs) if w.end >= lo and w.start <= hi]
        for a, _ in lcs(len(near), len(said), _same_key([refs[i].key for i in near], said)):
            partial_at.setdefault(near[a], at)
    for i, w in enumerate(refs):
        due = stream.due(w.end)
        if i in final_at:
            out.final_s.append(final_at[i] - due)
        if i in partial_at:
            out.partial_s.append(partial_at[i] - due)
        if i in final_at or i in partial_at:
            out.shown_s.append(min(final_at.get(i, math.inf), partial_at.get(i, math.inf)) - due)
    out.finals_text = [str(e.data["text"]) for _, e in finals]
    _edits(events, out)
    return out


def _same_final(ref: RefWord, said: tuple[str, float, float]) -> bool:
    return ref.key == said[0] and abs(ref.end - said[1]) <= MATCH_TOL_S


def _same_key(a: list[str], b: list[str]) -> Callable[[int, int], bool]:
    return lambda i, j: a[i] == b[j]


def _edits(events: list[tuple[float, Event]], out: Score) -> None:
    committed: list[str] = []
    partial: list[str] = []
    shown: list[str] = []
    for index, (at, event) in enumerate(events):
        words = words_of(str(event.data["text"]))
        if event.kind == EventKind.CAPTIONS:
            committed, partial = committed + words, []
            following = events[index + 1] if index + 1 < len(events) else None
            if following and following[1].kind == EventKind.PARTIALS and following[0] - at < BURST_S:
                continue  # the partial published with this final completes the update
        else:
            partial = words
        display = committed + partial
        kept = 0
        while kept < min(len(shown), len(display)) and shown[kept] == display[kept]:
            kept += 1
        out.updates += 1
        out.erased += len(shown) - kept
        out.revised += len(shown) > kept
        shown = display
    out.final_words += len(committed)


def summarise(run: Run) -> tuple[Score, dict[str, Any]]:
    total = Score()
    for stream in run.streams:
        total.add(score(stream))
    counters = [s.stage.counters() for s in run.streams]
    growth = backlog_growth(run)
    row = {
        "words": f"{len(total.final_s)}/{total.ref_words}",
        "final_p50_s": pct(total.final_s, 50),
        "final_p90_s": pct(total.final_s, 90),
        "partial_p50_s": pct(total.partial_s, 50),
        "partial_p90_s": pct(total.partial_s, 90),
        "in_partial": f"{len(total.partial_s)}/{total.ref_words}",
        "shown_p50_s": pct(total.shown_s, 50),
        "edit_pct": round(100 * total.revised / max(1, total.updates), 1),
        "erased_per_word": round(total.erased / max(1, total.final_words), 3),
        "dropped_s": round(sum(float(c["audio_dropped_seconds"]) for c in counters), 2),
        "backlog_max_s": round(max((b for _, b in run.backlog), default=0.0), 2),
        "backlog_growth_s": round(growth, 2),
        "decodes": sum(int(c["asr_decodes"]) for c in counters),
        # Speech per decode of a stream: the step_s it was configured with while the recognizer keeps up.
        "speech_per_decode_s": round(
            sum(float(c["speech_seconds"]) for c in counters) / max(1, sum(int(c["asr_decodes"]) for c in counters)), 2
        ),
        "rejected": sum(int(c["asr_rejected"]) for c in counters),
        "asr_errors": sum(int(c["asr_errors"]) for c in counters),
        "window_mean_s": round(float(np.mean(run.windows)), 1) if run.windows else None,
        "items_per_call": round(run.batch_items / max(1, run.batch_calls), 2),
        "call_ms": round(1000 * run.asr_busy_s / max(1, run.batch_calls)),
        "asr_busy_pct": round(100 * run.asr_busy_s / run.seconds, 1),
        "feed_late_p99_ms": pct(np.array(run.lateness) * 1000, 99),
        "unfinished": run.unfinished,
        "stages_ms": run.stages_ms,
    }
    return total, row


def backlog_growth(run: Run) -> float:
    """How much the backlog rose over the speech (least-squares line; it swings by a recognizer
    round, so the line, not the ends, says whether it grows)."""
    speech_end = max(len(s.clip.samples) for s in run.streams) / RATE - TRAIL_S
    points = np.array([(t, b) for t, b in run.backlog if LEAD_S + 1.0 <= t <= speech_end])
    if len(points) < 10:
        return 0.0
    slope = np.polyfit(points[:, 0], points[:, 1], 1)[0]
    return float(slope * (points[-1, 0] - points[0, 0]))


def behind(row: dict[str, Any]) -> bool:
    """Clearly past real time (no point adding streams): audio dropped, or finals twice too late."""
    p90 = row["final_p90_s"]
    return row["dropped_s"] > 0 or row["unfinished"] > 0 or p90 is None or p90 > 2 * REALTIME_FINAL_P90_S


def realtime(row: dict[str, Any]) -> bool:
    p90 = row["final_p90_s"]
    return (
        row["dropped_s"] == 0
        and p90 is not None
        and p90 <= REALTIME_FINAL_P90_S
        and row["backlog_growth_s"] <= BACKLOG_GROWTH_S
        and row["unfinished"] == 0
    )


def script_wer(text: str, whole: bool) -> float:
    return 100 * (wer(script(), text) if whole else script_prefix_wer(text))


# -- parts --------------------------------------------------------------------------------------

LATENCY_COLUMNS = [
    "case", "words", "final_p50_s", "final_p90_s", "partial_p50_s", "partial_p90_s", "in_partial", "shown_p50_s",
    "edit_pct", "erased_per_word", "decodes", "window_mean_s", "call_ms", "detector_fps",
]  # fmt: skip
WER_COLUMNS = ["run", "offline_wer_pct", "streaming_wer_pct", "difference_points", "streaming_vs_offline_pct"]
WER_SET_COLUMNS = ["clip", "words", "offline_wer_pct", "streaming_wer_pct", "difference_points", "transcript_wer_pct",
                   "transcript_difference_points", "decodes"]
CPU_COLUMNS = [
    "case", "asr_busy_pct", "asr_cpu_pct", "asr_wait_ms", "det_cpu_pct", "det_wait_ms", "detector_fps",
    "detector_dropped",
]  # fmt: skip
STREAM_COLUMNS = [
    "max_batch", "streams", "final_p50_s", "final_p90_s", "partial_p50_s", "dropped_s", "backlog_max_s",
    "backlog_growth_s", "speech_per_decode_s", "window_mean_s", "items_per_call", "call_ms", "asr_busy_pct",
    "asr_errors", "feed_late_p99_ms", "realtime",
]  # fmt: skip


async def part_wer(
    recognizer: SpeechRecognizer, vad: VadModel, clips: Sequence[SpeechClip], offline: dict[str, str]
) -> list[dict[str, Any]]:
    rows, totals = [], {"words": 0, "offline": 0.0, "streaming": 0.0, "transcript": 0.0, "decodes": 0}
    async with SpeechBatcher(recognizer, max_batch=8) as batcher:
        for clip in clips:
            streamed = await stream_file(batcher, vad, SETTINGS, clip.audio, lead_s=LEAD_S, trail_s=TRAIL_S)
            words = len(words_of(clip.text))
            off, on = wer(clip.text, offline[clip.name]), wer(clip.text, streamed.text)
            kept = wer(clip.text, streamed.transcript)
            rows.append(_wer_row(clip.name, words, off * words, on * words, kept * words, decodes=streamed.decodes)
                        | {"text": streamed.text, "transcript": streamed.transcript})
            totals["words"] += words
            totals["offline"] += off * words
            totals["streaming"] += on * words
            totals["transcript"] += kept * words
            totals["decodes"] += streamed.decodes
            print(table([rows[-1]], WER_SET_COLUMNS), flush=True)
    rows.append(_wer_row("all", int(totals["words"]), totals["offline"], totals["streaming"], totals["transcript"],
                         decodes=int(totals["decodes"])))
    return rows


def _wer_row(
    name: str, words: int, offline_errors: float, streaming_errors: float, transcript_errors: float, *, decodes: int
) -> dict[str, Any]:
    off, on, kept = (100 * errors / words for errors in (offline_errors, streaming_errors, transcript_errors))
    return {
        "clip": name,
        "words": words,
        "offline_wer_pct": round(off, 1),
        "streaming_wer_pct": round(on, 1),
        "difference_points": round(on - off, 1),
        "transcript_wer_pct": round(kept, 1),
        "transcript_difference_points": round(kept - off, 1),
        "decodes": decodes,
    }


async def part_latency(
    recognizer: SpeechRecognizer, vad: VadModel, clip: Clip, ref: Reference, whole: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    run = await run_streams(recognizer, vad, [clip], max_batch=8)
    total, row = summarise(run)
    streamed = " ".join(total.finals_text)
    offline = " ".join(
        w.key for w in ref.words if w.start >= clip.first - 0.05 and w.end <= clip.last + 0.05
    )  # words_of() of the offline transcript within the clip: the same words WER sees
    wer_row = {
        "offline_wer_pct": round(script_wer(offline, whole), 1),
        "streaming_wer_pct": round(script_wer(streamed, whole), 1),
    }
    wer_row["difference_points"] = round(wer_row["streaming_wer_pct"] - wer_row["offline_wer_pct"], 1)
    wer_row["streaming_vs_offline_pct"] = round(100 * wer(offline, streamed), 1)
    return {"case": "alone", **row}, {**wer_row, "streamed_text": streamed, "offline_text": offline}


async def part_streams(
    recognizer: SpeechRecognizer, vad: VadModel, audio: np.ndarray, ref: Reference, args: argparse.Namespace
) -> list[dict[str, Any]]:
    length = len(audio) / RATE
    most = max(args.streams)
    span = max(0.0, length - args.stream_seconds)
    clips: list[Clip] = []
    starts = [(a + b) / 2 for a, b in ref.pauses if (a + b) / 2 <= span]
    for i in range(most):  # different slices, so the streams do not speak in lockstep
        free = [c for c in starts if all(abs(c - clip.first) > 0.1 for clip in clips)] or starts
        target = i * span / most
        first = 0.0 if i == 0 else min(free, key=lambda c: abs(c - target))
        last = nearest_pause(ref, first + args.stream_seconds, length)
        clips.append(make_clip(f"slice{i}", audio, ref, first, last))
    rows = []
    for max_batch in args.batches:
        for n in args.streams:
            run = await run_streams(recognizer, vad, clips[:n], max_batch=max_batch)
            _, row = summarise(run)
            row = {"max_batch": max_batch, "streams": n, **row}
            row["realtime"] = realtime(row)
            rows.append(row)
            print(table([row], STREAM_COLUMNS), flush=True)
            if behind(row):
                break
    return rows


async def part_detector(recognizer: SpeechRecognizer, vad: VadModel, clip: Clip) -> list[dict[str, Any]]:
    detector = create_detector(default_detector_model(), "onnx-cpu")
    try:
        frames = decode_frames(VTEST if VTEST.exists() else ensure_sample(), 50, start=100)
        detector.detect(frames[:1])  # warm-up
        rows: list[dict[str, Any]] = []
        async with DetectionBatcher(detector) as batcher:  # the detector alone, at the camera's rate
            load = CameraLoad(batcher, frames)
            task = asyncio.create_task(load.run())
            await asyncio.sleep(1.0)
            before, started = load.processed, time.monotonic()
            await asyncio.sleep(DETECTOR_ALONE_S)
            fps = (load.processed - before) / (time.monotonic() - started)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        rows.append({"case": "detector alone", "detector_fps": round(fps, 2)})
        for shared in (False, True):
            compute = None
            if shared:
                cores = os.cpu_count() or 1
                compute = ComputeBudget(cores, critical_max_share=CPU_SHARE)
                compute.add(DETECTOR, detector_claim(detector, cores))
                compute.add(RECOGNIZER, recognizer_claim(recognizer))
            async with DetectionBatcher(detector, compute=compute) as batcher:
                load = CameraLoad(batcher, frames)
                run = await run_streams(recognizer, vad, [clip], max_batch=8, compute=compute, load=load)
            _, row = summarise(run)
            case = f"+ detector, compute budget (bound {CPU_SHARE})" if shared else "+ detector, no budget"
            row = {"case": case, **row, "detector_fps": run.detector_fps, "detector_dropped": run.detector_dropped,
                   "by_age": run.by_age}  # fmt: skip
            for name, key in ((RECOGNIZER, "asr"), (DETECTOR, "det")):
                turn = (run.turns or {}).get(name, {})
                row[f"{key}_cpu_pct"] = turn.get("cpu_pct")
                row[f"{key}_wait_ms"] = turn.get("wait_ms_per_turn")
            rows.append(row)
            print(table([row], LATENCY_COLUMNS), flush=True)
        return rows
    finally:
        detector.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    if not NARRATION.exists():
        ensure_sample()
    audio = load_pcm16k(NARRATION)
    vad = VadModel.load()
    started = time.monotonic()
    offline = create_recognizer(args.model, device="cpu", compute_type=args.compute_type, window="padded")
    offline_texts: dict[str, str] = {}
    clips_for_wer: list[SpeechClip] = []
    try:
        ref = offline_reference(offline, audio, vad)
        if "wer" in args.parts:
            clips_for_wer = speech_set(NARRATION, script())
            offline_texts = {c.name: offline_reference(offline, c.audio, vad).text for c in clips_for_wer[1:]}
            offline_texts["narration"] = ref.text
    finally:
        offline.close()
    errors = np.abs(ref.alignment_error)
    print(
        f"reference: {len(ref.words)} words, {len(ref.pauses)} pauses; alignment check (word end - pause start): "
        f"median {np.median(ref.alignment_error):+.3f} s, |p90| {np.percentile(errors, 90):.3f} s "
        f"({time.monotonic() - started:.1f} s)",
        flush=True,
    )
    length = len(audio) / RATE
    last = nearest_pause(ref, min(args.seconds, length), length)
    whole = last >= length - 0.5
    clip = make_clip("narration", audio, ref, 0.0, last)

    # as the service: window "audio", CTranslate2's threads
    recognizer = create_recognizer(args.model, device="cpu", compute_type=args.compute_type, beam_size=args.beam_size)
    result: dict[str, Any] = {
        "model": recognizer.info.name,
        "compute_type": recognizer.info.compute_type,
        "settings": asdict(SETTINGS),
        "clip_s": round(last, 2),
        "stream_seconds": args.stream_seconds,
        "reference": {
            "method": "offline, same model, padded window, pieces <= 28 s cut at VAD pauses, DTW word ends",
            "words": len(ref.words),
            "alignment_error_s": ref.alignment_error,
        },
    }
    latency_rows: list[dict[str, Any]] = []
    try:
        recognizer.transcribe_batch([AsrRequest(audio[: 3 * RATE])] * 4)  # warm-up: first calls pick kernels
        if "latency" in args.parts:
            result["wer"] = []
            for attempt in range(1, args.repeat + 1):  # streaming WER depends on when decodes land: repeat
                row, wer_row = await part_latency(recognizer, vad, clip, ref, whole)
                row["case"] = f"alone #{attempt}"
                latency_rows.append(row)
                result["wer"].append({"run": attempt, **wer_row})
                print(table([row], LATENCY_COLUMNS), flush=True)
        if "wer" in args.parts:
            result["wer_set"] = await part_wer(recognizer, vad, clips_for_wer, offline_texts)
        if "streams" in args.parts:
            result["streams"] = await part_streams(recognizer, vad, audio, ref, args)
        if "detector" in args.parts:
            latency_rows += await part_detector(recognizer, vad, clip)
    finally:
        recognizer.close()
    result["latency"] = latency_rows
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    result["wall_s"] = round(time.monotonic() - started, 1)

    print(f"\none stream, real time ({clip.last:.1f} s of narration; seconds after the word ends in the audio)")
    if latency_rows:
        print(table(latency_rows, LATENCY_COLUMNS))
    if any("detector" in r["case"] for r in latency_rows):
        print("\nCPU while the detector runs at 10 fps (asr_busy: recognizer calls incl. waiting for a turn)")
        print(table(latency_rows, CPU_COLUMNS))
        for r in latency_rows:
            if r.get("by_age"):
                print(f"\nstreaming decodes against the utterance's age ({r['case']}): flat when the window is bounded")
                print(table(r["by_age"], list(r["by_age"][0])))
    if result.get("wer"):
        print("\nWER % against the script (one stream; streaming: its finals)")
        print(table(result["wer"], WER_COLUMNS))
    if result.get("wer_set"):
        print("\nWER % on the speech set (streaming: the stage's finals in file mode; offline: padded 30 s pieces)")
        print(table(result["wer_set"], WER_SET_COLUMNS))
    if "streams" in result:
        print(f"\nconcurrent streams, real time, {args.stream_seconds:g} s slices, one shared recognizer")
        print(table(result["streams"], STREAM_COLUMNS))
    print("\n" + "\n".join(verdicts(result)))
    return result


def verdicts(result: dict[str, Any]) -> list[str]:
    lines = []
    alone = [r for r in result["latency"] if r["case"].startswith("alone")]
    for key, label, limit in (("final_p50_s", "finals p50", 1.0), ("partial_p50_s", "first partials p50", 0.5)):
        if alone:
            values = [r[key] for r in alone]
            lines.append(f"{label} {values} s (target <= {limit}): {_met_runs(values, limit)}")
    if result.get("wer"):
        diffs = [w["difference_points"] for w in result["wer"]]
        lines.append(f"streaming - offline WER {diffs} points (target <= +2): {_met_runs(diffs, 2.0)}")
    if result.get("wer_set"):
        diff = result["wer_set"][-1]["difference_points"]
        lines.append(f"streaming - offline WER on the speech set {diff:+.1f} points (target <= +2): {_met(diff, 2.0)}")
    for batch in sorted({r["max_batch"] for r in result.get("streams", [])}, reverse=True):
        kept = [r["streams"] for r in result["streams"] if r["max_batch"] == batch and r["realtime"]]
        best = max(kept, default=0)
        lines.append(f"streams kept real-time, max_batch {batch}: {best} (target >= 6): {_met(-best, -6)}")
    return lines


def _met_runs(values: list[float | None], limit: float) -> str:
    met = sum(v is not None and v <= limit for v in values)
    return "met" if met == len(values) else "NOT met" if met == 0 else f"met in {met} of {len(values)} runs"


def _met(value: float | None, limit: float) -> str:
    return "-" if value is None else ("met" if value <= limit else "NOT met")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="latency,wer,streams,detector")
    parser.add_argument("--seconds", type=float, default=60.0, help="narration for latency/detector (cut at a pause)")
    parser.add_argument("--stream-seconds", type=float, default=20.0, help="narration per stream in the streams part")
    parser.add_argument("--streams", default="1,2,4,6,8")
    parser.add_argument("--batches", default="8,1", help="SpeechBatcher max_batch values")
    parser.add_argument("--repeat", type=int, default=2, help="runs of the one-stream latency/WER part")
    parser.add_argument("--step-s", type=float, default=None, help="CaptionPolicy.step_s (default: the service's)")
    parser.add_argument("--model", type=Path, default=None, help="CTranslate2 Whisper dir (default: bundled tiny.en)")
    parser.add_argument("--beam-size", type=int, default=DEFAULT_BEAM_SIZE,
                        help="the streaming recognizer's beam (captions.beam_size; the offline side stays greedy)")
    parser.add_argument("--compute-type", default="int8", help="CTranslate2 compute type of both recognizers")
    parser.add_argument("--quick", action="store_true", help="15 s clips, streams 1,2,4")
    args = parser.parse_args()
    args.parts = args.parts.split(",")
    args.streams = [int(s) for s in args.streams.split(",")]
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.quick:
        args.seconds, args.stream_seconds, args.streams, args.repeat = 15.0, 10.0, [1, 2, 4], 1
    if args.step_s is not None:
        global SETTINGS
        SETTINGS = replace(SETTINGS, step_s=args.step_s)
    result = asyncio.run(main_async(args))
    print(f"\nwrote {write_results('captions', result)}")


if __name__ == "__main__":
    main()
