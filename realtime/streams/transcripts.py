"""The recent final captions of every stream, for `GET /api/streams/{id}/captions.vtt`.

Fed with every `captions` event the streams publish (a tap on the fan-out), kept per stream for
`max_age_s` of media time and at most `max_cues` cues, and dropped with the stream. Finals never
change, so a cue is written once and only ever falls off the old end.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pipelines.events import Event, EventKind

DEFAULT_MAX_AGE_S = 600.0  # the last ten minutes of speech
DEFAULT_MAX_CUES = 2000


@dataclass(frozen=True, slots=True)
class Cue:
    start: float  # media seconds
    end: float
    text: str


class TranscriptStore:
    def __init__(self, *, max_age_s: float = DEFAULT_MAX_AGE_S, max_cues: int = DEFAULT_MAX_CUES) -> None:
        self.max_age_s = max_age_s
        self.max_cues = max_cues
        self._cues: dict[str, deque[Cue]] = {}

    def tap(self, event: Event) -> None:
        if event.kind is not EventKind.CAPTIONS:
            return
        data = event.data
        try:
            cue = Cue(float(data["start"]), float(data["end"]), str(data["text"]))
        except (KeyError, TypeError, ValueError):
            return
        cues = self._cues.setdefault(event.stream_id, deque(maxlen=self.max_cues))
        cues.append(cue)
        while cues and cues[0].end < cue.end - self.max_age_s:
            cues.popleft()

    def cues(self, stream_id: str) -> list[Cue]:
        return sorted(self._cues.get(stream_id, ()), key=lambda c: (c.start, c.end))

    def forget(self, stream_id: str) -> None:
        self._cues.pop(stream_id, None)


def vtt_time(seconds: float) -> str:
    millis = max(0, round(seconds * 1000))
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}.{millis:03d}"


def _cue_text(text: str) -> str:
    # WebVTT cue text: no blank lines, no "-->", and &, < escaped (the rest is plain text).
    flat = " ".join(text.split())
    return flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_webvtt(cues: list[Cue]) -> str:
    """A WebVTT file; cue times are the stream's media seconds, each cue at least 0.1 s long."""
    blocks = ["WEBVTT"]
    for number, cue in enumerate(cues, 1):
        end = max(cue.end, cue.start + 0.1)
        blocks.append(f"{number}\n{vtt_time(cue.start)} --> {vtt_time(end)}\n{_cue_text(cue.text)}")
    return "\n\n".join(blocks) + "\n"
