"""The recent captions of every stream, for `GET /api/streams/{id}/captions.vtt`, and their
English track (`translations` events), for `GET /api/streams/{id}/translation.vtt`.

Fed with every `captions` and `transcript` event the streams publish (a tap on the fan-out), kept
per stream for `max_age_s` of media time and at most `max_cues` cues, and dropped with the stream.
A final is a cue as it arrives; once its utterance's transcript (the utterance decoded whole)
arrives, the transcript's sentences take the place of the finals it replaces. Each cue keeps the
language it was heard in, so one file per language can be read back; translations are cues of their
own, bounded alike.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from pipelines.captions.utterances import SENTENCE_STOPS
from pipelines.event_bodies import CaptionBody, SpokenWord, TranscriptBody, TranslationBody
from pipelines.events import Event

DEFAULT_MAX_AGE_S = 600.0  # the last ten minutes of speech
DEFAULT_MAX_CUES = 2000
CUE_MAX_WORDS = 16  # a transcript is cut into cues at sentence ends and at most this many words


@dataclass(frozen=True, slots=True)
class Cue:
    start: float  # media seconds
    end: float
    text: str
    segment_id: str | None = None  # the final's; None for a transcript's cue
    language: str = "en"


class TranscriptStore:
    def __init__(self, *, max_age_s: float = DEFAULT_MAX_AGE_S, max_cues: int = DEFAULT_MAX_CUES) -> None:
        self.max_age_s = max_age_s
        self.max_cues = max_cues
        self._cues: dict[str, deque[Cue]] = {}
        self._translations: dict[str, deque[Cue]] = {}

    def tap(self, event: Event) -> None:
        body = event.body
        if isinstance(body, CaptionBody):
            new = [Cue(body.spoken.start, body.spoken.end, body.text, body.segment_id, body.language)]
            replaced: set[str] = set()
        elif isinstance(body, TranscriptBody):
            new = transcript_cues(body.spoken.words, body.language)
            replaced = set(body.replaces)
        elif isinstance(body, TranslationBody):
            self._add(self._translations, event.stream_id, [Cue(body.start, body.end, body.text, None, body.language)])
            return
        else:
            return
        self._add(self._cues, event.stream_id, new, replaced)

    def _add(self, store: dict[str, deque[Cue]], stream_id: str, new: list[Cue], replaced: set[str] = set()) -> None:  # noqa: B006
        cues = store.setdefault(stream_id, deque(maxlen=self.max_cues))
        if replaced:
            kept = [c for c in cues if c.segment_id not in replaced]
            cues.clear()
            cues.extend(kept)
        cues.extend(new)
        newest = max((c.end for c in cues), default=0.0)
        while cues and cues[0].end < newest - self.max_age_s:
            cues.popleft()

    def cues(self, stream_id: str, language: str | None = None) -> list[Cue]:
        """The spoken captions, all languages or the one asked for."""
        kept = (c for c in self._cues.get(stream_id, ()) if language is None or c.language == language)
        return sorted(kept, key=lambda c: (c.start, c.end))

    def translations(self, stream_id: str, language: str = "en") -> list[Cue]:
        kept = (c for c in self._translations.get(stream_id, ()) if c.language == language)
        return sorted(kept, key=lambda c: (c.start, c.end))

    def languages(self, stream_id: str) -> dict[str, list[str]]:
        """The languages the stream's kept cues were heard in, and its translations' languages."""
        return {
            "spoken": sorted({c.language for c in self._cues.get(stream_id, ())}),
            "translations": sorted({c.language for c in self._translations.get(stream_id, ())}),
        }

    def forget(self, stream_id: str) -> None:
        self._cues.pop(stream_id, None)
        self._translations.pop(stream_id, None)


def transcript_cues(words: Sequence[SpokenWord], language: str = "en") -> list[Cue]:
    """A transcript's words as cues: a sentence each, at most CUE_MAX_WORDS words."""
    cues: list[Cue] = []
    line: list[SpokenWord] = []
    for i, w in enumerate(words):
        line.append(w)
        if len(line) >= CUE_MAX_WORDS or w.word.endswith(SENTENCE_STOPS) or i == len(words) - 1:
            cues.append(Cue(line[0].start, line[-1].end, " ".join(x.word for x in line), None, language))
            line = []
    return cues


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
