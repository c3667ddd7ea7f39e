"""The caption window policy, as pure decisions: when a stream's window is decoded again, when it
is kept short, where it is cut, and what a decode is forced to begin with. The stage holds the
audio and the events; this module holds the numbers, so a policy can be read, tested and tried
(bench/bench_caption_policy.py) without audio or a recognizer.

A recognizer with room decodes the whole utterance up to `max_window_s`: Whisper hears each word
with the speech before it, as an offline transcription does. While the shared recognizer is
loaded, windows are kept short for the streams' sake: cut after each committed sentence and
mid-sentence once committed words fill more than COMMITTED_KEPT_S of it (a second of them stays as
sound, the rest is prompt and prefix), because every decode re-reads the whole window. The
measurements behind these choices are in docs/captions.md and docs/compute.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipelines.captions.agreement import Word, join_words

MIN_DECODE_S = 0.3  # a window shorter than this is not worth a decode
SENTENCE_END = re.compile(r"[.?!][\"')\]]*$")
TRAILING_PUNCTUATION = re.compile(r"[^\w\s']+$")
MIN_TRIM_S = 2.5  # a window this long is cut after its committed sentence (loaded)
SENTENCE_CONTEXT_S = 1.0  # of the committed sentence, kept as sound before the next one
COMMITTED_KEPT_S = 2.0
TRIM_CONTEXT_S = 1.0  # committed speech kept as sound by such a cut
LOADED_MAX_WINDOW_S = 6.0  # max_window_s while the recognizer is that loaded
TRIM_LOAD = 0.5  # recognizer load (share of its workers' time busy) from which windows are kept short
# Past this load every stream waits for a longer step before its next decode: fewer, slightly later
# partials for all, instead of audio piling up until it is dropped.
STRETCH_LOAD = 0.7
STRETCH = 1.5
MIN_CUT_S = 0.5  # smaller cuts are not worth a re-join of the window


def decode_due(*, grown_s: float, window_s: float, step_s: float, live: bool, load: float) -> bool:
    """Decode again: the window grew by a step (a longer one while the recognizer is very busy)."""
    if grown_s < step_s or window_s < MIN_DECODE_S:
        return False
    return not live or grown_s >= STRETCH * step_s or load < STRETCH_LOAD


def short_windows(*, live: bool, load: float) -> bool:
    """Keep windows short (and force their committed words) for other streams' sake; a file read
    ahead has no deadline."""
    return live and load >= TRIM_LOAD


def window_limit(max_window_s: float, *, short: bool) -> float:
    # Decodes that keep disagreeing grow the window, which makes every decode dearer and slower:
    # on a saturated recognizer that spirals. Give up on them sooner.
    return min(max_window_s, LOADED_MAX_WINDOW_S) if short else max_window_s


def forced_prefix(committed: Sequence[Word], window_start: float) -> str:
    """The committed words still in a short window, which its decode must begin with: such a
    window is often cut mid-sentence, and without them it is heard as something else."""
    # The last word's punctuation is the decoder's to choose again: it was committed before the
    # pause after it was heard, and a forced comma makes the next sentence's start a guess.
    return TRAILING_PUNCTUATION.sub("", join_words([w for w in committed if w.end > window_start]))


def sentence_cut(
    window_start: float, last: Word | None, pending: Sequence[Word], last_cut: float
) -> float | None:
    """Where a short window is cut after its newest committed sentence (in the pause after it,
    never into a word), or None. The window keeps SENTENCE_CONTEXT_S before the cut: cut right at a
    sentence's start, Whisper guesses its first words with no sound before them."""
    if last is None or not SENTENCE_END.search(last.text) or last.end <= last_cut:
        return None
    if not pending:
        cut = last.end
    elif pending[0].start > last.end:
        cut = (last.end + pending[0].start) / 2
    else:
        return None
    return cut if cut - window_start >= MIN_TRIM_S else None


def committed_cut(
    window_start: float, committed: Sequence[Word], committed_end: float, kept_s: float = COMMITTED_KEPT_S
) -> float | None:
    """Where to cut a window before a committed word so that about TRIM_CONTEXT_S of committed
    speech stays ahead of what is pending (in the gap before that word), or None while the window
    holds no more than `kept_s` of committed speech."""
    if committed_end - window_start <= kept_s:
        return None
    words = [w for w in committed if w.start >= window_start]
    cut = None
    for before, word in zip(words, words[1:], strict=False):
        if word.start > committed_end - TRIM_CONTEXT_S:
            break
        cut = (before.end + word.start) / 2
    return cut if cut is not None and cut - window_start >= MIN_CUT_S else None
