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


def test_the_window_bound_follows_the_stages_lag_with_hysteresis() -> None:
    bound = policy.window_bound
    assert bound(0.0, tight=False) is policy.ROOMY
    assert bound(policy.LAG_TIGHT_S - 0.01, tight=False) is policy.ROOMY
    assert bound(policy.LAG_TIGHT_S, tight=False) is policy.TIGHT  # fell behind: keep less, catch up
    assert bound(policy.LAG_ROOMY_S + 0.01, tight=True) is policy.TIGHT  # not back yet
    assert bound(policy.LAG_ROOMY_S, tight=True) is policy.ROOMY
    assert policy.TIGHT.kept_s < policy.ROOMY.kept_s and policy.TIGHT.limit_s < policy.ROOMY.limit_s
    capped = policy.ROOMY.capped(4.0)
    assert (capped.kept_s, capped.context_s, capped.limit_s) == (4.0, policy.ROOMY.context_s, 4.0)


def test_the_lag_is_smoothed_so_one_slow_decode_does_not_flip_the_bound() -> None:
    lag = policy.smoothed_lag(0.0, 1.0)
    assert 0.0 < lag < policy.LAG_TIGHT_S
    for _ in range(5):
        lag = policy.smoothed_lag(lag, 1.0)
    assert lag >= policy.LAG_TIGHT_S  # a lag that lasts does


def test_a_window_is_cut_in_the_pause_after_its_committed_sentence_keeping_its_context() -> None:
    last = w(" night.", 3.0, 3.4)
    cut = policy.sentence_cut
    assert cut(0.0, last, [], float("-inf"), 1.0) == 3.4
    assert cut(0.0, last, [w(" The", 3.8, 4.0)], float("-inf"), 1.0) == pytest.approx(3.6)  # mid-pause
    assert cut(0.0, last, [w(" The", 3.2, 4.0)], float("-inf"), 1.0) is None  # never into a word
    assert cut(0.0, w(" night", 3.0, 3.4), [], float("-inf"), 1.0) is None  # not a sentence end
    assert cut(0.0, last, [], 3.4, 1.0) is None  # cut there already
    assert cut(2.0, last, [], float("-inf"), 1.0) is None  # the context kept would be nearly all of it
    assert cut(0.0, last, [], float("-inf"), 3.0) is None  # a roomier context keeps the window whole


def test_a_cut_before_committed_words_keeps_its_context_of_them_as_sound() -> None:
    words = [w(f" w{i}", 0.5 * i, 0.5 * i + 0.4) for i in range(10)]  # w9 ends at 4.9
    cut = policy.committed_cut
    assert cut(0.0, words, 1.9, kept_s=2.0, context_s=1.0) is None  # no more than 2 s committed: kept whole
    # In the gap before w7: w7 and w8 stay as sound (w8 starts within a second of the end, so the
    # cut cannot go past the word before it).
    assert cut(0.0, words, 4.9, kept_s=2.0, context_s=1.0) == pytest.approx(3.45)
    assert cut(0.0, words, 4.9, kept_s=0.0, context_s=1.0) == pytest.approx(3.45)
    assert cut(0.0, words, 4.9, kept_s=2.0, context_s=3.0) == pytest.approx(1.45)  # w3 on: at least 3 s kept
    assert cut(0.0, words, 4.9, kept_s=6.0, context_s=3.0) is None  # within a roomy bound
    assert cut(3.0, words, 4.9, kept_s=0.0, context_s=1.0) is None  # under MIN_CUT_S from the start


def test_the_forced_prefix_is_the_committed_words_in_the_window_without_their_last_punctuation() -> None:
    committed = [w(" Good", 0.0, 0.3), w(" evening,", 0.3, 0.8), w(" this", 1.0, 1.2), w(" is.", 1.2, 1.5)]
    assert policy.forced_prefix(committed, 0.5) == "evening, this is"
