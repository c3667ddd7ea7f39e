"""Speech for WER: the narration plus espeak-ng clips of samples/speech/*.txt in other voices and
speeds, so a streaming-vs-offline difference rests on ~1,300 words rather than one 153-word clip.
One word of that clip is 0.65 points, and any policy change moves tiny.en's errors around: on the
first set of ~500 words one change moved the difference by up to 1.5 points either way, so the
set now holds every text in two voices.

`stream_file` runs the production caption stage on a clip fed as fast as its decodes allow (file
mode). Its decodes happen at the same audio positions as a live stream's while the recognizer
keeps up with that stream (each decode is due after the same `step_s` of audio), so its finals are
the live finals; on the narration both gave the same text (bench_captions.py --parts latency).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from engines.asr.vad import VadModel
from pipelines.captions.engine import CaptionEngine, CaptionPolicy, SpeechBatcher
from pipelines.captions.stage import CaptionStage
from pipelines.captions.transcript import kept_text
from pipelines.events import Event, EventKind
from pipelines.frames import AudioChunk
from pipelines.mailbox import AudioBuffer
from tests.support.speech import load_pcm16k

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ROOT / "samples" / "speech"
CACHE = ROOT / ".cache" / "samples" / "speech"
RATE = 16_000
CHUNK = 320  # 20 ms
# clip: (text, espeak-ng voice, words per minute): other voices and speeds than the narration's en-us 160.
VOICES = {
    "meeting": ("meeting", "en-gb", 170),
    "weather": ("weather", "en-us", 150),
    "instructions": ("instructions", "en-gb-x-rp", 165),
    "handover": ("handover", "en-us-nyc", 165),
    "delivery": ("delivery", "en-us+f2", 155),
    "tour": ("tour", "en-gb-x-gbclan", 160),
    "meeting-2": ("meeting", "en-us+f4", 165),
    "weather-2": ("weather", "en-gb-scotland", 160),
    "instructions-2": ("instructions", "en-029", 155),
}


@dataclass(frozen=True, slots=True)
class SpeechClip:
    name: str
    text: str  # what is said (the WER reference)
    audio: np.ndarray  # 16 kHz mono float32


def speech_set(narration: Path, narration_text: str) -> list[SpeechClip]:
    clips = [SpeechClip("narration", narration_text, load_pcm16k(narration))]
    for name, (source, voice, wpm) in VOICES.items():
        text = (TEXTS / f"{source}.txt").read_text(encoding="utf-8")
        clips.append(SpeechClip(name, text, load_pcm16k(_synthesize(source, text, voice, wpm))))
    return clips


def _synthesize(name: str, text: str, voice: str, wpm: int) -> Path:
    target = CACHE / f"{name}-{voice}-{wpm}.wav"
    if target.exists():
        return target
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is not installed: run deploy/setup.sh")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(wav), text], check=True, timeout=60)
        wav.replace(target)
    return target


class Streamed(NamedTuple):
    text: str  # the finals
    decodes: int
    transcript: str  # as read back: each utterance's transcript in place of its finals


class _Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event) -> None:
        self.events.append(event)


async def stream_file(
    batcher: SpeechBatcher,
    vad: VadModel,
    settings: CaptionPolicy,
    audio: np.ndarray,
    *,
    lead_s: float,
    trail_s: float,
) -> Streamed:
    """The finals' text, decodes and transcript of one clip through the caption stage in file mode."""
    samples = np.concatenate(
        (np.zeros(int(lead_s * RATE), np.float32), audio, np.zeros(int(trail_s * RATE), np.float32))
    )
    buffer = AudioBuffer(max_seconds=len(samples) / RATE + 1)
    sink = _Sink()
    stage = CaptionStage("wer", buffer, CaptionEngine(batcher, vad, settings), sink, live=False)
    wall = time.time()
    for k in range(len(samples) // CHUNK):
        buffer.put(AudioChunk("wer", k * CHUNK / RATE, wall, samples[k * CHUNK : (k + 1) * CHUNK]))
    buffer.close()
    await stage.run()
    finals = [str(e.data["text"]) for e in sink.events if e.kind == EventKind.CAPTIONS]
    return Streamed(" ".join(finals), stage.stats.decodes, kept_text(sink.events))
