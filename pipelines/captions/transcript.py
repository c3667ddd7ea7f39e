"""The transcript: the speech decoded again, in pieces, with the context the finals lacked.

Finals are committed while the speaker is still talking, by two decodes agreeing on words heard
with at most half a second of speech after them, from a streaming window kept short. Whisper
hears a word best with the speech on both sides of it, as an offline transcription does; close
decodes also agree on the same mistake. So the speech is decoded once more, piece by piece, with
a beam, and published as `transcript` events that replace the finals in what is kept
(captions.vtt, the timeline, the page's caption panel). Finals stay the live, low-lag captions;
the transcript is what is read back.

A piece does not wait for a pause: a speaker who never pauses would otherwise get no transcript
until Whisper's 30 s window is full. Once the committed speech since the last cut is
PIECE_MIN_S long and ends a sentence, or PIECE_MAX_S long (cut in the widest gap between its
segments), it is cut after a caption segment, so a transcript replaces whole segments; an
utterance's end cuts the rest. Its decode hears more than the piece:
  - LEFT_CONTEXT_S of audio before it, whose words the transcript before already holds: they are
    the decoder's forced prefix, so the piece's words begin exactly where the last piece's ended
    (by sequence, not by time) and are heard with the speech before them;
  - RIGHT_CONTEXT_S after the cut, so its last words are heard with what follows; the words
    there are left to the next piece.
The measurements behind these choices are in docs/captions.md.

This module holds the utterance's audio and segments, the cuts and the context; the stage
decodes and publishes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pipelines.captions.agreement import MAX_REPEAT_WORDS, Word, join_words, normalise
from pipelines.captions.policy import SENTENCE_END, TRAILING_PUNCTUATION
from pipelines.captions.window import AudioWindow
from pipelines.event_bodies import CaptionBody, TranscriptBody
from pipelines.events import Event

PIECE_MIN_S = 2.0  # a piece is cut after a sentence once its committed speech is this long
PIECE_MAX_S = 3.5  # and after a segment once it is this long, whatever the sentence
LEFT_CONTEXT_S = 4.0  # transcribed audio heard again before a piece (its words: the forced prefix)
RIGHT_CONTEXT_S = 1.5  # audio after a piece's cut that its decode hears
MIN_RIGHT_S = 1.0  # a piece is not cut until at least this much audio follows the cut
EDGE_S = 0.05  # a prefix word starts at least this far into the piece's audio (not cut into)
GAP_CHOICE_S = 1.0  # a piece cut mid-sentence is cut at the widest gap among its last segments this long
CUT_PAD_S = 0.15  # audio kept after a piece's last word (no more than half the gap to the next)
WHISPER_MAX_S = 29.5  # audio one decode may hear (Whisper's window is 30 s)
PROMPT_KEPT = 1024  # characters of transcript kept for the next piece's prompt
HEARD_KEPT = 64  # transcript words kept as the next piece's possible prefix
UNHEARD_SLACK_S = 0.6  # a final this far from every decoded word was left out by the decode
MISSED_WORDS_OK = 1  # finals a decode may leave out (one word heard otherwise, or not at all)
MAX_WORD_S = 1.5  # a decoded word longer than this was stretched over speech the decode left out


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
    """Audio to transcribe and the segments its transcript replaces. The audio begins up to
    LEFT_CONTEXT_S before `start` (speech already transcribed) and may run past `end` (context)."""

    audio: np.ndarray
    audio_start: float  # media seconds of its first sample
    start: float  # where the piece's own speech begins: the last cut, or the utterance's start
    end: float  # the cut: words heard after it are the next piece's
    segments: tuple[Segment, ...]

    @property
    def finals(self) -> list[Word]:
        return [w for s in self.segments for w in s.words]


class UtteranceRecorder:
    """The current utterance's audio (from the pre-roll, or the context before the last cut, on),
    the segments published since the last cut, and the transcript so far."""

    def __init__(self) -> None:
        self.audio = AudioWindow()
        self.segments: list[Segment] = []
        self.cut: float | None = None  # where the next piece begins; None: where the audio does
        self.text = ""  # the transcript so far (its tail), the next piece's prompt
        self.heard: deque[Word] = deque(maxlen=HEARD_KEPT)  # its last words, with their times
        self.untranscribed_s = 0.0  # audio dropped from a piece that outgrew Whisper's window

    def append(self, pts: float, samples: np.ndarray) -> None:
        self.audio.append(pts, samples)

    def idle(self, pre_roll_s: float) -> None:
        """Nobody speaks: keep only what may be the next utterance's pre-roll."""
        if not self.segments:
            self.audio.keep_last(pre_roll_s)
            self.cut = None

    def add(self, segment_id: str, words: Sequence[Word]) -> None:
        if words:
            self.segments.append(Segment(segment_id, tuple(words)))

    def clear(self) -> None:
        self.audio.clear()
        self.segments.clear()
        self.cut = None

    @property
    def start(self) -> float:
        """Where the next piece's own speech begins."""
        return self.audio.start if self.cut is None else max(self.cut, self.audio.start)

    def finish(self) -> Piece | None:
        """The rest of the utterance, which has ended; None when nothing was said in it."""
        segments, self.segments = tuple(self.segments), []
        audio = self.audio
        piece = Piece(audio.audio(), audio.start, self.start, audio.end, segments) if segments else None
        audio.clear()
        self.cut = None
        return piece

    def due(self, pending_start: float | None) -> Piece | None:
        """A piece cut after a segment, once the committed speech since the last cut is long
        enough (see piece_cut); `pending_start` is where the words not final yet begin."""
        audio, start = self.audio, self.start
        cut_at = piece_cut(self.segments, start, pending_start=pending_start, heard_to=audio.end - MIN_RIGHT_S)
        if cut_at is None:
            if audio.end - start > WHISPER_MAX_S:  # nothing final for that long: the oldest cannot be kept
                before = audio.duration
                audio.keep_last(WHISPER_MAX_S - LEFT_CONTEXT_S)
                self.untranscribed_s += before - audio.duration
            return None
        index, cut = cut_at
        segments, self.segments = tuple(self.segments[: index + 1]), self.segments[index + 1 :]
        heard_to = min(audio.end, cut + RIGHT_CONTEXT_S)
        samples = audio.audio()[: int(round((heard_to - audio.start) * audio.rate))]
        piece = Piece(samples, audio.start, start, cut, segments)
        audio.trim_before(cut - LEFT_CONTEXT_S)
        self.cut = cut
        return piece

    def context(self, piece: Piece) -> tuple[float, list[Word]]:
        """Where the piece's decode begins, and the transcript's words it hears first there (the
        forced prefix, see `forced_text`): the last transcript words that lie wholly inside the
        piece's audio, the audio cut in the gap before the first of them. None lie there at an
        utterance's start."""
        heard = list(self.heard)
        first = len(heard)
        while first > 0 and heard[first - 1].start >= piece.audio_start + EDGE_S:
            first -= 1
        prefix = heard[first:]
        if not prefix:
            return piece.audio_start, []
        before = heard[first - 1].end if first > 0 else prefix[0].start - EDGE_S
        return max(piece.audio_start, (before + prefix[0].start) / 2), prefix

    def prompt(self, prefix: Sequence[Word]) -> str:
        """The transcript before the prefix: what was said before the piece's audio."""
        said = join_words(prefix)
        return self.text[: len(self.text) - len(said)].rstrip() if said and self.text.endswith(said) else self.text

    def remember(self, words: Sequence[Word]) -> None:
        self.heard.extend(words)
        self.text = f"{self.text} {join_words(words)}".strip()[-PROMPT_KEPT:]

    def keys(self) -> list[str]:
        """The transcript's last words, compared as LocalAgreement compares them."""
        return [k for k in (normalise(w) for w in self.text.split()[-MAX_REPEAT_WORDS:]) if k]


def forced_text(prefix: Sequence[Word]) -> str:
    """The prefix as the decoder is forced to begin: without its last punctuation, which the decode
    chooses again. A period forced there made the decoder start a new sentence and skip the words
    that did not begin one ("standing closed." then "Someone", where "close to it" was said)."""
    return TRAILING_PUNCTUATION.sub("", join_words(prefix))


def after_prefix(words: Sequence[Word], prefix: Sequence[Word]) -> list[Word]:
    """The decoded words after the forced prefix: the decoder's text begins with it, though its
    word split may differ (punctuation joined to a word), so it is matched by its letters."""
    wanted = sum(len(w.key) for w in prefix)
    taken = 0
    for index, word in enumerate(words):
        if taken >= wanted:
            return list(words[index:])
        taken += len(word.key)
    return []


def unheard(finals: Sequence[Word], heard: Sequence[Word], slack_s: float = UNHEARD_SLACK_S) -> list[Word]:
    """The finals no decoded word lies near (middle to middle): speech a decode left out (a beam
    that ended its hypothesis early, or skipped a phrase it could not fit). By the words' middles,
    because the alignment stretches the last word of a decode that stopped early over the audio
    it did not transcribe ("2." over five seconds); such a word (longer than MAX_WORD_S) vouches
    for nothing."""
    middles = [(w.start + w.end) / 2 for w in heard if w.end - w.start <= MAX_WORD_S]
    return [w for w in finals if not any(abs((w.start + w.end) / 2 - m) <= slack_s for m in middles)]


def piece_cut(
    segments: Sequence[Segment], start: float, *, pending_start: float | None, heard_to: float = float("inf")
) -> tuple[int, float] | None:
    """(index of the piece's last segment, the cut's media time), or None while the committed
    speech since `start` is short: after the newest segment that ends a sentence PIECE_MIN_S or
    more in; else, once the speech is PIECE_MAX_S long, after the segment followed by the widest
    gap (a pause is the best place to cut a sentence) among those ending in the last GAP_CHOICE_S.
    Only segments ending by `heard_to` are candidates: the audio after a cut is the decode's context
    for the piece's last words, which are otherwise heard cut short and mended by nobody (they are
    the next prefix)."""
    segments = [s for s in segments if s.end <= heard_to]
    if not segments or segments[-1].end - start < PIECE_MIN_S:
        return None
    candidates = [i for i, s in enumerate(segments) if s.end - start >= PIECE_MIN_S]

    def following(i: int) -> float | None:
        return segments[i + 1].words[0].start if i + 1 < len(segments) else pending_start

    sentences = [i for i in candidates if SENTENCE_END.search(segments[i].words[-1].text)]
    if sentences:
        chosen = sentences[-1]
    elif segments[-1].end - start >= PIECE_MAX_S:
        # Of the last GAP_CHOICE_S only: an earlier cut leaves words behind that then wait for a
        # whole piece more.
        recent = [i for i in candidates if segments[i].end >= segments[-1].end - GAP_CHOICE_S]
        chosen = max(recent, key=lambda i: (_gap(segments[i].end, following(i)), i))
    else:
        return None
    end, after = segments[chosen].end, following(chosen)
    pad = CUT_PAD_S if after is None else max(0.0, min(CUT_PAD_S, (after - end) / 2))
    return chosen, end + pad


def _gap(end: float, following: float | None) -> float:
    return float("inf") if following is None else following - end


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
