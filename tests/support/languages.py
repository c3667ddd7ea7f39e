"""Speech in other languages for caption tests and benches: a few sentences per language,
synthesized with espeak-ng, and the English each one says."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np

from tests.support.speech import load_pcm16k

# By Whisper code (also the espeak-ng voice): sentences and their English, short and common so that a
# synthetic voice is still understood.
SENTENCES: dict[str, list[tuple[str, str]]] = {
    "en": [
        ("Good morning. Today it is very hot in the city.", "Good morning. Today it is very hot in the city."),
        ("The train leaves at ten in the morning.", "The train leaves at ten in the morning."),
        ("I really like to read books at night.", "I really like to read books at night."),
    ],
    "es": [
        ("Buenos días. Hoy hace mucho calor en la ciudad.", "Good morning. Today it is very hot in the city."),
        ("El tren sale a las diez de la mañana.", "The train leaves at ten in the morning."),
        ("Me gusta mucho leer libros por la noche.", "I really like to read books at night."),
    ],
    "fr": [
        ("Bonjour à tous. Il fait très beau aujourd'hui.", "Hello everyone. The weather is very nice today."),
        ("Le train part à dix heures du matin.", "The train leaves at ten in the morning."),
        ("J'aime beaucoup lire des livres le soir.", "I really like reading books in the evening."),
    ],
    "de": [
        ("Guten Morgen. Heute ist das Wetter sehr schön.", "Good morning. Today the weather is very nice."),
        ("Der Zug fährt um zehn Uhr morgens ab.", "The train leaves at ten in the morning."),
        ("Ich lese am Abend sehr gern Bücher.", "I really like reading books in the evening."),
    ],
    # Written in kana: espeak-ng reads kanji as "Chinese letter". (Its Mandarin voices, characters or
    # pinyin, came out as speech Whisper base could not make out at all: "War Henry III III II V".)
    "ja": [
        ("おはようございます。きょうは とても あつい です。", "Good morning. It is very hot today."),
        ("でんしゃは あさ じゅうじに でます。", "The train leaves at ten in the morning."),
        ("わたしは よる ほんを よむのが すきです。", "I like reading books at night."),
    ],
}
WORDS_PER_MINUTE = 140  # espeak-ng's default 175 is too quick for a small model to follow
PAUSE_S = 1.2  # between sentences: each is an utterance of its own


def synthesize(text: str, voice: str) -> np.ndarray:
    """One sentence as 16 kHz mono float32."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed: run deploy/setup.sh")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(WORDS_PER_MINUTE), "-w", str(path), text], check=True)
        return load_pcm16k(path)


def spoken(language: str, count: int | None = None, *, lead_s: float = 0.5) -> np.ndarray:
    """The language's sentences one after another, a pause after each."""
    gap = np.zeros(int(PAUSE_S * 16_000), np.float32)
    parts = [np.zeros(int(lead_s * 16_000), np.float32)]
    for text, _ in SENTENCES[language][:count]:
        parts += [synthesize(text, language), gap]
    return np.concatenate(parts)


def speech_clip(path: Path, samples: np.ndarray, *, fps: int = 5, size: tuple[int, int] = (160, 120)) -> Path:
    """An mp4 of grey frames with `samples` as its AAC audio: a camera that only talks."""
    import av  # local: the rest of this module needs no encoder

    seconds = len(samples) / 16_000
    pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    with av.open(str(path), "w", options={"movflags": "+faststart"}) as dst:
        video = dst.add_stream("libx264", rate=Fraction(fps, 1))
        video.width, video.height, video.pix_fmt = size[0], size[1], "yuv420p"
        video.options = {"g": str(fps), "bf": "0", "preset": "ultrafast"}
        audio = dst.add_stream("aac", rate=16_000, layout="mono")
        grey = np.full((size[1], size[0], 3), 96, np.uint8)
        for index in range(int(seconds * fps) + 1):
            frame = av.VideoFrame.from_ndarray(grey, format="rgb24").reformat(format="yuv420p")
            frame.pts, frame.time_base = index, Fraction(1, fps)
            dst.mux(video.encode(frame))
        dst.mux(video.encode(None))
        sound = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        sound.sample_rate, sound.pts, sound.time_base = 16_000, 0, Fraction(1, 16_000)
        dst.mux(audio.encode(sound))
        dst.mux(audio.encode(None))
    return path
