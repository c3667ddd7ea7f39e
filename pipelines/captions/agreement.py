"""Which words of a re-decoded, growing audio window are final: LocalAgreement-2.

The window is decoded again each time it has grown by a step. A word is committed (final,
never changed) once two decodes in a row agree on it and on every word before it; what the
latest decode says after that is tentative (a partial). Words carry media times, so the words
already committed are recognised in a new hypothesis by time (a word whose middle lies before the
end of the last committed word) and, where Whisper shifts its times a little, by text (the first
few words repeating the committed tail are dropped, as is a start that says the committed text's
last sentence again: `repeated_start`). At a pause the pending words are committed
as they are (`flush`): nothing more will be said to confirm them.
"""

from __future__ import annotations

import re
import unicodedata
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

MAX_NGRAM = 5  # committed words a new hypothesis may repeat at its start
# A hypothesis that begins by saying the committed text's last sentence again, nearly word for
# word, is Whisper repeating its prompt (words committed with times too early leave their sound
# in the window, and the decoder hears the sentence once more, timed after them).
MIN_REPEAT_WORDS = 6
MAX_REPEAT_WORDS = 40
REPEAT_SIMILARITY = 0.75  # of a repeat of 10 words or more; a shorter one must match more closely
SHORT_REPEAT_SIMILARITY = 0.85
_NON_WORD = re.compile(r"[^\w']+")


@dataclass(frozen=True, slots=True)
class Word:
    text: str  # as Whisper spells it, leading space kept
    start: float  # media seconds
    end: float
    probability: float

    @property
    def key(self) -> str:
        return normalise(self.text)


def normalise(text: str) -> str:
    """Case, punctuation and spacing do not make words differ ("Hello," == "hello")."""
    return _NON_WORD.sub("", unicodedata.normalize("NFKC", text).lower())


def join_words(words: Sequence[Word]) -> str:
    return "".join(w.text for w in words).strip()


MAX_LOOP_NGRAM = 8


def repeated_start(keys: Sequence[str], before: Sequence[str]) -> int:
    """How many words at the start of `keys` say the end of `before` again (0 when they do not):
    the run of MIN_REPEAT_WORDS or more that matches the same number of last words of `before`
    most closely, nearly all of them (Whisper hears a few of them differently the second time).
    Real speech seldom says its last six words or more again straight after them; Whisper
    repeating its prompt does."""
    best, best_ratio = 0, 0.0
    for n in range(MIN_REPEAT_WORDS, min(MAX_REPEAT_WORDS, len(keys), len(before)) + 1):
        ratio = SequenceMatcher(None, list(keys[:n]), list(before[-n:]), autojunk=False).ratio()
        # The closest match, not the longest: one more word on each side may still pass.
        if ratio >= (REPEAT_SIMILARITY if n >= 10 else SHORT_REPEAT_SIMILARITY) and ratio >= best_ratio:
            best, best_ratio = n, ratio
    return best


def cut_repetition(words: Sequence[Word]) -> list[Word]:
    """The words before a repetition loop: where a run of 2 to 8 words is immediately said again
    (or one word a third time), Whisper has started looping at the edge of its window; what
    follows the first copy is not speech. Real speech rarely repeats itself verbatim back to back."""
    keys = [w.key for w in words]
    for i in range(len(keys)):
        if i >= 2 and keys[i] == keys[i - 1] == keys[i - 2]:
            return list(words[:i])
        for n in range(2, min(MAX_LOOP_NGRAM, (i + 1) // 2) + 1):
            if keys[i - n + 1 : i + 1] == keys[i - 2 * n + 1 : i - n + 1]:
                return list(words[: i - n + 1])
    return list(words)


def drop_repeated_sentences(words: Sequence[Word]) -> list[Word]:
    """`words` without the second copy of any run of MIN_REPEAT_WORDS or more said twice in a row,
    word for word (seen live in a whole-utterance decode: a sentence, then the same sentence
    again, then the speech that followed). What comes after the copy is kept: unlike a loop at the
    window's edge, the decoder went on with the speech."""
    keys = [w.key for w in words]
    kept: list[Word] = []
    i = 0
    while i < len(words):
        for n in range(min(MAX_REPEAT_WORDS, (len(keys) - i) // 2), MIN_REPEAT_WORDS - 1, -1):
            if keys[i : i + n] == keys[i + n : i + 2 * n]:
                kept += words[i : i + n]
                i += 2 * n
                break
        else:
            kept.append(words[i])
            i += 1
    return kept


class LocalAgreement:
    def __init__(self) -> None:
        self.committed_end = float("-inf")  # media end of the last committed word
        self._tail: deque[str] = deque(maxlen=MAX_REPEAT_WORDS)  # keys of the last committed words
        self.repeats_dropped = 0  # words of hypotheses that said committed words again
        self.overdue_commits = 0  # words committed by `overdue`, without two decodes agreeing
        self._previous: list[Word] = []  # the last hypothesis, past what is committed

    @property
    def pending(self) -> list[Word]:
        """The tentative words of the last hypothesis."""
        return list(self._previous)

    def update(
        self, hypothesis: Sequence[Word], *, horizon: float = float("inf"), overdue: float = float("-inf")
    ) -> tuple[list[Word], list[Word]]:
        """(words committed now, tentative words after them) for a new decode of the window.

        Words ending after `horizon` stay tentative whatever the decodes say: at the window's
        growing edge a word may be cut short, and two decodes agreeing on its guess is not
        evidence (the audio that decides it has not arrived yet). Words ending by `overdue` are
        committed as this decode says them even where the last one disagreed: decodes that keep
        changing their minds about a word would otherwise hold it, and every word after it, until
        they happen to agree twice (seconds, on a word the model cannot make out), and this decode
        heard the most sound after it."""
        fresh = self._after_committed(hypothesis)
        agreed = 0
        for old, new in zip(self._previous, fresh, strict=False):
            if old.key != new.key or not new.key or new.end > horizon:
                break
            agreed += 1
        while agreed < len(fresh) and fresh[agreed].end <= min(overdue, horizon):
            agreed += 1
            self.overdue_commits += 1
        committed, tentative = fresh[:agreed], fresh[agreed:]
        self._commit(committed)
        self._previous = tentative
        return committed, tentative

    def flush(self, hypothesis: Sequence[Word] | None = None) -> list[Word]:
        """Commit what a final decode says (or, without one, the pending words) and start over."""
        words = self._after_committed(hypothesis) if hypothesis is not None else self._previous
        self._commit(words)
        self._previous = []
        return list(words)

    def _commit(self, words: Sequence[Word]) -> None:
        for word in words:
            self._tail.append(word.key)
        if words:
            self.committed_end = max(self.committed_end, words[-1].end)

    def _after_committed(self, hypothesis: Sequence[Word]) -> list[Word]:
        fresh = [w for w in hypothesis if (w.start + w.end) / 2 > self.committed_end and w.key]
        if not fresh or not self._tail:
            return fresh
        tail = list(self._tail)
        repeated = repeated_start([w.key for w in fresh], tail)
        if repeated:
            self.repeats_dropped += repeated
            return fresh[repeated:]
        for n in range(min(MAX_NGRAM, len(tail), len(fresh)), 0, -1):
            if [w.key for w in fresh[:n]] == tail[-n:]:
                return fresh[n:]
        return fresh
