"""The caption window policy, as pure decisions: when a stream's window is decoded again, how much
of it is kept, where it is cut, and what a decode is forced to begin with. The stage holds the
audio and the events; this module holds the numbers, so a policy can be read, tested and tried
(bench/bench_caption_policy.py) without audio or a recognizer.

Every streaming decode re-reads its whole window, so the window is bounded whatever the
utterance's length: committed words leave it, carried as the decoder's prompt, and only the last
few seconds of them stay as sound (the window's `context`) before the words still pending, forced
as the decode's prefix. A decode then costs about the same at the first second of a monologue as
at its fifth minute, and the finals' lag cannot grow with it. How much context stays is steered
by the stage's lag (the audio that arrived while its last decode ran): a stage falling behind
keeps less and catches up, one that keeps up keeps more and reads more accurately. The
measurements behind these choices are in docs/captions.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipelines.captions.agreement import Word, join_words

MIN_DECODE_S = 0.3  # a window shorter than this is not worth a decode
SENTENCE_END = re.compile(r"[.?!][\"')\]]*$")
TRAILING_PUNCTUATION = re.compile(r"[^\w\s']+$")
MIN_CUT_S = 0.5  # smaller cuts are not worth a re-join of the window
# Past this recognizer load every stream waits for a longer step before its next decode: fewer,
# slightly later partials for all, instead of audio piling up.
STRETCH_LOAD = 0.7
STRETCH = 1.5


@dataclass(frozen=True, slots=True)
class WindowBound:
    """How much of an utterance a streaming window holds."""

    kept_s: float  # committed speech a window may hold; past it the window is cut
    context_s: float  # committed speech such a cut (and a cut after a sentence) keeps as sound
    limit_s: float  # a window whose decodes keep disagreeing this long is given up: its words are final

    def capped(self, max_window_s: float) -> WindowBound:
        return WindowBound(min(self.kept_s, max_window_s), min(self.context_s, max_window_s),
                           min(self.limit_s, max_window_s))  # fmt: skip


# A stage that keeps up: 3-6 s of committed speech before the pending words (windows of 4-5 s).
ROOMY = WindowBound(kept_s=6.0, context_s=3.0, limit_s=10.0)
# A stage falling behind: 1-2 s (windows of 2-3 s), about half the cost of a decode.
TIGHT = WindowBound(kept_s=2.0, context_s=1.0, limit_s=6.0)
LAG_TIGHT_S = 0.5  # a stage lagging this much behind its newest audio keeps tight windows
LAG_ROOMY_S = 0.25  # until its lag is back under this
LAG_SMOOTHING = 0.3  # weight of the newest decode's lag in the stage's lag


def decode_due(*, grown_s: float, window_s: float, step_s: float, live: bool, load: float) -> bool:
    """Decode again: the window grew by a step (a longer one while the recognizer is very busy)."""
    if grown_s < step_s or window_s < MIN_DECODE_S:
        return False
    return not live or grown_s >= STRETCH * step_s or load < STRETCH_LOAD


def smoothed_lag(previous: float, newest: float) -> float:
    return previous + LAG_SMOOTHING * (newest - previous)


def window_bound(lag_s: float, *, tight: bool) -> WindowBound:
    """The bound for a stage `lag_s` behind its newest audio; `tight`: its bound now (hysteresis,
    so one slow decode does not flip it back and forth)."""
    if lag_s >= LAG_TIGHT_S or (tight and lag_s > LAG_ROOMY_S):
        return TIGHT
    return ROOMY


def forced_prefix(committed: Sequence[Word], window_start: float) -> str:
    """The committed words still in a window, which its decode must begin with: a window is often
    cut mid-sentence, and without them it is heard as something else."""
    # The last word's punctuation is the decoder's to choose again: it was committed before the
    # pause after it was heard, and a forced comma makes the next sentence's start a guess.
    return TRAILING_PUNCTUATION.sub("", join_words([w for w in committed if w.end > window_start]))


def sentence_cut(
    window_start: float, last: Word | None, pending: Sequence[Word], last_cut: float, context_s: float
) -> float | None:
    """Where a window is cut after its newest committed sentence (in the pause after it, never
    into a word), or None. The window keeps `context_s` before the cut: cut right at a sentence's
    start, Whisper guesses its first words with no sound before them."""
    if last is None or not SENTENCE_END.search(last.text) or last.end <= last_cut:
        return None
    if not pending:
        cut = last.end
    elif pending[0].start > last.end:
        cut = (last.end + pending[0].start) / 2
    else:
        return None
    return cut if cut - window_start >= context_s + MIN_CUT_S else None


def committed_cut(
    window_start: float, committed: Sequence[Word], committed_end: float, *, kept_s: float, context_s: float
) -> float | None:
    """Where to cut a window before a committed word so that about `context_s` of committed speech
    stays ahead of what is pending (in the gap before that word), or None while the window holds
    no more than `kept_s` of committed speech."""
    if committed_end - window_start <= kept_s:
        return None
    words = [w for w in committed if w.start >= window_start]
    cut = None
    for before, word in zip(words, words[1:], strict=False):
        if word.start > committed_end - context_s:
            break
        cut = (before.end + word.start) / 2
    return cut if cut is not None and cut - window_start >= MIN_CUT_S else None
