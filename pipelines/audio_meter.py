"""The audio stage of streams without captions (no speech recognizer in the service, or the
stream's captions are off): it consumes the audio so its buffer never fills, and counts it."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.graph import StageContext, counter, gauge, register_counters
from pipelines.graph.counters import Counters
from pipelines.mailbox import AudioBuffer, MailboxClosed

STAGE_NAME = "audio"
AUDIO_BUFFER_SECONDS = 30.0

register_counters(
    {
        "audio_seconds": counter("Seconds of audio decoded"),
        "audio_dropped_seconds": counter("Seconds of audio dropped because its reader fell behind"),
        "audio_buffered_s": gauge("Audio waiting, in seconds", metric="audio_buffered_seconds"),
    },
    section="audio",
)


@dataclass(slots=True)
class AudioMeterStats:
    chunks: int = 0
    seconds: float = 0.0
    last_pts: float | None = None


class AudioMeter:
    name = STAGE_NAME

    def __init__(self, audio: AudioBuffer) -> None:
        self.audio = audio
        self.stats = AudioMeterStats()

    async def run(self) -> None:
        while True:
            try:
                chunks = await self.audio.get_many()
            except MailboxClosed:
                return
            for chunk in chunks:
                self.stats.chunks += 1
                self.stats.seconds += chunk.duration
                self.stats.last_pts = chunk.pts

    def stop(self) -> None:
        """Nothing to do: the meter ends when its buffer closes."""

    def counters(self) -> Counters:
        return audio_counters(self.audio)


def audio_counters(audio: AudioBuffer) -> Counters:
    """What every audio stage reports about its buffer."""
    stats = audio.stats
    return {
        "audio_seconds": round(stats.seconds_in, 2),
        "audio_dropped_seconds": round(stats.seconds_dropped, 2),
        "audio_buffered_s": round(audio.buffered_seconds, 3),
    }


def build(ctx: StageContext) -> AudioMeter | None:
    if ctx.audio_taken:
        return None  # a stage before it (captions) takes the audio and counts it
    audio = ctx.audio(STAGE_NAME, max_seconds=AUDIO_BUFFER_SECONDS)
    return None if audio is None else AudioMeter(audio)
