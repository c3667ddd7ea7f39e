"""The transcript of an utterance: its audio decoded whole once it has ended.

Finals are committed while the speaker is still talking, by two decodes agreeing on words heard
with at most half a second of speech after them. Whisper hears a word best with the speech on both
sides of it, as an offline transcription does; close decodes also agree on the same mistake. So
once an utterance ends (a pause), its audio is decoded once more, whole, prompted with the
transcript before it, and published as a `transcript` event that replaces the utterance's finals
in what is kept (captions.vtt, the timeline, the page's caption panel). Finals stay the live,
low-lag captions; the transcript is what is read back. The measurements behind this are in
docs/captions.md.

Continuous speech is transcribed in pieces of at most PIECE_MAX_S (Whisper hears 30 s), cut
after a caption segment, preferably one that ends a sentence, so a transcript replaces whole
segments.

This module holds the utterance's audio and segments and the cut; the stage decodes and publishes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pipelines.captions.agreement import MAX_REPEAT_WORDS, Word, normalise
from pipelines.captions.policy import SENTENCE_END
from pipelines.captions.window import AudioWindow
from pipelines.event_bodies import CaptionBody, TranscriptBody
from pipelines.events import Event

PIECE_MAX_S = 25.0  # a piece of continuous speech transcribed once it is this long
MIN_PIECE_S = 5.0  # a long piece is cut after a sentence at least this far into it
CUT_PAD_S = 0.15  # audio kept after a piece's last word (no more than half the gap to the next)
WHISPER_MAX_S = 29.5  # audio one decode may hear (Whisper's window is 30 s)
PROMPT_KEPT = 1024  # characters of transcript kept for the next piece's prompt


@dataclass(frozen=True, slots=True)
class Segment:
    """A published caption segment (one `captions` event) and its words."""

    segment_id: str
    words: tuple[Word, ...]

    @property
    def end(self) -> float:
        return self.words[-1].end


@dataclass(frozen=True, slots=True)
class Piece:
    """Audio to transcribe and the segments its transcript replaces."""

    audio: np.ndarray
    start: float  # media seconds of its first sample
    end: float
    segments: tuple[Segment, ...]

    @property
    def finals(self) -> list[Word]:
        return [w for s in self.segments for w in s.words]


class UtteranceRecorder:
    """The current utterance's audio (from the pre-roll on) and the segments published in it."""

    def __init__(self) -> None:
        self.audio = AudioWindow()
        self.segments: list[Segment] = []
        self.text = ""  # the transcript so far (its tail), the next piece's prompt
        self.untranscribed_s = 0.0  # audio dropped from a piece that outgrew Whisper's window

    def append(self, pts: float, samples: np.ndarray) -> None:
        self.audio.append(pts, samples)

    def idle(self, pre_roll_s: float) -> None:
        """Nobody speaks: keep only what may be the next utterance's pre-roll."""
        if not self.segments:
            self.audio.keep_last(pre_roll_s)

    def add(self, segment_id: str, words: Sequence[Word]) -> None:
        if words:
            self.segments.append(Segment(segment_id, tuple(words)))

    def clear(self) -> None:
        self.audio.clear()
        self.segments.clear()

    def finish(self) -> Piece | None:
        """The whole utterance, which has ended; None when nothing was said in it."""
        segments, self.segments = tuple(self.segments), []
        audio = self.audio
        piece = Piece(audio.audio(), audio.start, audio.end, segments) if segments else None
        audio.clear()
        return piece

    def due(self, pending_start: float | None) -> Piece | None:
        """A piece of a long utterance, cut after a segment, once the audio passed PIECE_MAX_S;
        `pending_start` is where the words not final yet begin."""
        audio = self.audio
        if audio.duration < PIECE_MAX_S:
            return None
        cut_at = piece_cut(self.segments, audio.start, pending_start=pending_start)
        if cut_at is None:
            if audio.duration > WHISPER_MAX_S:  # nothing final for that long: the oldest cannot be kept
                before = audio.duration
                audio.keep_last(PIECE_MAX_S)
                self.untranscribed_s += before - audio.duration
            return None
        index, cut = cut_at
        segments, self.segments = tuple(self.segments[: index + 1]), self.segments[index + 1 :]
        samples = audio.audio()[: int(round((cut - audio.start) * audio.rate))]
        piece = Piece(samples, audio.start, cut, segments)
        audio.trim_before(cut)
        return piece

    def remember(self, text: str) -> None:
        self.text = f"{self.text} {text}".strip()[-PROMPT_KEPT:]

    def keys(self) -> list[str]:
        """The transcript's last words, compared as LocalAgreement compares them."""
        return [k for k in (normalise(w) for w in self.text.split()[-MAX_REPEAT_WORDS:]) if k]


def piece_cut(segments: Sequence[Segment], start: float, *, pending_start: float | None) -> tuple[int, float] | None:
    """(index of the piece's last segment, the cut's media time): after the newest segment that
    ends a sentence at least MIN_PIECE_S in, else after the newest segment; None without one."""
    if not segments:
        return None
    chosen = len(segments) - 1
    for i in range(len(segments) - 1, -1, -1):
        if segments[i].end - start >= MIN_PIECE_S and SENTENCE_END.search(segments[i].words[-1].text):
            chosen = i
            break
    end = segments[chosen].end
    following = segments[chosen + 1].words[0].start if chosen + 1 < len(segments) else pending_start
    pad = CUT_PAD_S if following is None else max(0.0, min(CUT_PAD_S, (following - end) / 2))
    return chosen, end + pad


def kept_text(events: Iterable[Event]) -> str:
    """A stream's speech as it is read back from its events: the finals, in order, each utterance's
    replaced by its transcript once that arrived."""
    pieces: dict[str, str] = {}  # segment id, or the transcript's first replaced id -> text
    for event in events:
        body = event.body
        if isinstance(body, CaptionBody):
            pieces[body.segment_id] = body.text
        elif isinstance(body, TranscriptBody):
            for segment_id in body.replaces[1:]:
                pieces.pop(segment_id, None)
            if body.replaces:
                pieces[body.replaces[0]] = body.text
    return " ".join(text for text in pieces.values() if text)
