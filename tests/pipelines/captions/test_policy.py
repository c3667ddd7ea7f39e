"""The caption window policy's decisions, without audio or a recognizer."""

from __future__ import annotations

import pytest

from pipelines.captions import policy
from pipelines.captions.agreement import Word


def w(text: str, start: float, end: float) -> Word:
    return Word(text, start, end, 0.9)


def test_decodes_come_every_step_and_stretch_only_live_on_a_very_busy_recognizer() -> None:
    due = policy.decode_due
    assert not due(grown_s=0.4, window_s=3.0, step_s=0.5, live=True, load=0.0)
    assert not due(grown_s=0.5, window_s=0.2, step_s=0.5, live=True, load=0.0)  # too short to decode
    assert due(grown_s=0.5, window_s=3.0, step_s=0.5, live=True, load=0.69)
    assert not due(grown_s=0.5, window_s=3.0, step_s=0.5, live=True, load=0.7)  # waits for 1.5 steps
    assert due(grown_s=0.75, window_s=3.0, step_s=0.5, live=True, load=0.9)
    assert due(grown_s=0.5, window_s=3.0, step_s=0.5, live=False, load=0.9)  # a file has no deadline


def test_short_windows_only_live_and_loaded_and_their_limit() -> None:
    assert policy.short_windows(live=True, load=0.5) and not policy.short_windows(live=True, load=0.49)
    assert not policy.short_windows(live=False, load=1.0)
    assert policy.window_limit(28.0, short=True) == 6.0 and policy.window_limit(28.0, short=False) == 28.0


def test_a_short_window_is_cut_in_the_pause_after_its_committed_sentence() -> None:
    last = w(" night.", 3.0, 3.4)
    assert policy.sentence_cut(0.0, last, [], float("-inf")) == 3.4
    assert policy.sentence_cut(0.0, last, [w(" The", 3.8, 4.0)], float("-inf")) == pytest.approx(3.6)  # mid-pause
    assert policy.sentence_cut(0.0, last, [w(" The", 3.2, 4.0)], float("-inf")) is None  # never into a word
    assert policy.sentence_cut(0.0, w(" night", 3.0, 3.4), [], float("-inf")) is None  # not a sentence end
    assert policy.sentence_cut(0.0, last, [], 3.4) is None  # cut there already
    assert policy.sentence_cut(1.5, last, [], float("-inf")) is None  # under MIN_TRIM_S of window


def test_a_cut_before_committed_words_keeps_about_a_second_of_them_as_sound() -> None:
    words = [w(f" w{i}", 0.5 * i, 0.5 * i + 0.4) for i in range(10)]  # w9 ends at 4.9
    assert policy.committed_cut(0.0, words, 1.9) is None  # no more than 2 s committed: kept whole
    cut = policy.committed_cut(0.0, words, 4.9)
    # In the gap before w7: w7 and w8 stay as sound (w8 starts within a second of the end, so the
    # cut cannot go past the word before it).
    assert cut == pytest.approx(3.45)
    assert policy.committed_cut(0.0, words, 4.9, kept_s=0.0) == cut
    assert policy.committed_cut(3.0, words, 4.9, kept_s=0.0) is None  # under MIN_CUT_S from the start


def test_the_forced_prefix_is_the_committed_words_in_the_window_without_their_last_punctuation() -> None:
    committed = [w(" Good", 0.0, 0.3), w(" evening,", 0.3, 0.8), w(" this", 1.0, 1.2), w(" is.", 1.2, 1.5)]
    assert policy.forced_prefix(committed, 0.5) == "evening, this is"
