"""What `vidsentry run` prints of the captions: a line per sentence (or per utterance, where it
ends without one), and how many finals there were.

Lines are made of the transcript when the stream has one (`captions.transcript`, on by default):
its pieces trail the speaker by a few seconds, but they are the speech decoded with the context
the finals lacked, punctuated, so a sentence reads as one line. Finals come a few words at a time
and mostly unpunctuated while someone talks on; joined, they ran on for thirty words a line.
Without a transcript the finals are printed the same way. With `captions.translate`, each
transcript's English text follows it on a line of its own, marked with its language."""

from __future__ import annotations

from collections.abc import Sequence

from pipelines.captions.utterances import SENTENCE_STOPS, UTTERANCE_PAUSE_S
from pipelines.event_bodies import CaptionBody, SpokenBody, SpokenWord, TranscriptBody, TranslationBody
from pipelines.events import Event

LINE_MAX_WORDS = 30  # a sentence that runs on is printed in pieces of about this many words


class SpokenLines:
    def __init__(self, *, transcript: bool = True) -> None:
        self._read: type[SpokenBody] = TranscriptBody if transcript else CaptionBody
        self.captions = 0
        self._line: list[str] = []
        self._line_start = 0.0
        self._line_end = 0.0
        self._line_stream = ""

    def see(self, event: Event) -> list[str]:
        body = event.body
        if isinstance(body, CaptionBody):
            self.captions += 1
        if isinstance(body, TranslationBody):
            return [*self.flush(), f"[{event.stream_id} {body.start:7.1f}s] ({body.language}) {body.text}"]
        return self._words(event.stream_id, body.spoken.words) if isinstance(body, self._read) else []

    def counts(self) -> dict[str, int]:
        return {"captions": self.captions}

    def _words(self, stream_id: str, words: Sequence[SpokenWord]) -> list[str]:
        lines: list[str] = []
        for word in words:
            if not word.word:
                continue
            if self._line and (stream_id != self._line_stream or word.start - self._line_end >= UTTERANCE_PAUSE_S):
                lines += self.flush()
            if not self._line:
                self._line_start, self._line_stream = word.start, stream_id
            self._line.append(word.word)
            self._line_end = word.end
            if word.word.endswith(SENTENCE_STOPS) or len(self._line) >= LINE_MAX_WORDS:
                lines += self.flush()
        return lines

    def flush(self) -> list[str]:
        """The sentence gathered so far (at its end, a pause, or when the stream stops)."""
        if not self._line:
            return []
        line = f"[{self._line_stream} {self._line_start:7.1f}s] {' '.join(self._line)}"
        self._line = []
        return [line]
