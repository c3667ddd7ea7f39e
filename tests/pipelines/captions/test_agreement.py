"""LocalAgreement: a word is final once two decodes in a row agree on it and all before it."""

from __future__ import annotations

import numpy as np

from pipelines.captions.agreement import LocalAgreement, Word, drop_repeated_sentences, normalise, repeated_start
from pipelines.captions.window import AudioWindow


def words(text: str, start: float = 0.0, step: float = 0.4) -> list[Word]:
    return [Word(f" {w}", start + i * step, start + i * step + step * 0.8, 0.9) for i, w in enumerate(text.split())]


def texts(ws: list[Word]) -> list[str]:
    return [w.text.strip() for w in ws]


def test_words_are_committed_when_two_decodes_agree() -> None:
    agreement = LocalAgreement()
    assert agreement.update(words("the quick")) == ([], words("the quick"))
    committed, tentative = agreement.update(words("the quick brown fox"))
    assert texts(committed) == ["the", "quick"] and texts(tentative) == ["brown", "fox"]
    committed, tentative = agreement.update(words("the quick brown fax jumps"))
    assert texts(committed) == ["brown"] and texts(tentative) == ["fax", "jumps"]


def test_a_disagreement_early_on_commits_nothing_after_it() -> None:
    agreement = LocalAgreement()
    agreement.update(words("a cat sat"))
    committed, tentative = agreement.update(words("a hat sat on"))
    assert texts(committed) == ["a"] and texts(tentative) == ["hat", "sat", "on"]


def test_committed_words_are_never_emitted_twice_even_when_times_shift() -> None:
    agreement = LocalAgreement()
    agreement.update(words("hello world how"))
    committed, _ = agreement.update(words("hello world how are"))
    assert texts(committed) == ["hello", "world", "how"]
    # Whisper moves its times a little: the committed words come back starting slightly later.
    shifted = words("world how are you", start=0.45)
    committed, tentative = agreement.update(shifted)
    assert texts(committed) == ["are"] and texts(tentative) == ["you"]


def test_words_past_the_overdue_line_are_committed_as_the_newest_decode_says_them() -> None:
    # Decodes that keep flipping on a word (seen live: "net was" / "network to" / "net was the one")
    # hold it and everything after it; past `overdue` the newest decode's words are taken.
    agreement = LocalAgreement()
    agreement.update(words("the parcel net was"))
    committed, tentative = agreement.update(words("the parcel network to go"), overdue=0.5)
    assert texts(committed) == ["the", "parcel"] and texts(tentative) == ["network", "to", "go"]
    assert agreement.overdue_commits == 0  # agreement alone committed these
    # The newest decode's "net" (0.8-1.12) and "was" (1.2-1.52) end by 1.6; its "the" does not.
    committed, tentative = agreement.update(words("the parcel net was the one Wednesday"), overdue=1.6)
    assert texts(committed) == ["net", "was"] and texts(tentative) == ["the", "one", "Wednesday"]
    assert agreement.overdue_commits == 2
    # Never past the horizon: a word cut short at the window's edge is not taken, overdue or not.
    agreement = LocalAgreement()
    agreement.update(words("a b c"))
    committed, tentative = agreement.update(words("x y z"), horizon=0.5, overdue=2.0)
    assert texts(committed) == ["x"] and texts(tentative) == ["y", "z"]


def test_flush_commits_the_final_decode_past_what_is_committed() -> None:
    agreement = LocalAgreement()
    agreement.update(words("one two"))
    agreement.update(words("one two three"))
    assert texts(agreement.flush(words("one two three four"))) == ["three", "four"]
    assert agreement.pending == []
    assert agreement.flush() == []


def test_case_and_punctuation_do_not_make_words_differ() -> None:
    assert normalise(" Hello,") == normalise("hello") == "hello"
    agreement = LocalAgreement()
    agreement.update(words("Hello, there"))
    committed, _ = agreement.update(words("hello there friend"))
    assert texts(committed) == ["hello", "there"]


def test_the_window_keeps_media_time_when_trimmed() -> None:
    window = AudioWindow(rate=100)
    window.append(10.0, np.ones(100, np.float32))
    window.append(11.0, np.full(50, 2, np.float32))
    assert (window.start, window.duration, window.end) == (10.0, 1.5, 11.5)
    window.trim_before(10.5)
    assert window.start == 10.5 and window.audio().shape == (100,) and window.audio()[-1] == 2
    window.keep_last(0.2)
    assert window.start == 11.3 and window.duration == 0.2
    window.clear()
    window.append(20.0, np.zeros(10, np.float32))
    assert window.start == 20.0


def test_a_repetition_loop_is_cut_at_its_second_copy() -> None:
    from pipelines.captions.agreement import cut_repetition

    assert texts(cut_repetition(words("good morning good morning good morning"))) == ["good", "morning"]
    loop = words("a man in a dark jacket a building a building a building")
    assert texts(cut_repetition(loop)) == ["a", "man", "in", "a", "dark", "jacket", "a", "building"]
    assert texts(cut_repetition(words("no no no way"))) == ["no", "no"]
    honest = words("the north entrance camera of the city library plaza")
    assert cut_repetition(honest) == honest
    assert texts(cut_repetition(words("it is very very cold"))) == ["it", "is", "very", "very", "cold"]


def keys(text: str) -> list[str]:
    return [normalise(w) for w in text.split()]


def test_a_hypothesis_saying_the_last_committed_sentence_again_is_cut_to_what_follows() -> None:
    # Seen live: the sentence committed with times too early, its sound still in the window, and
    # the next decode hearing it once more (a little differently) before the new words.
    committed = keys("by courier rather than by post. We are open on week, during office hours and somewhere "
                     "in always at the front desk.")
    again = keys("We are open on weekends during office hours and someone is always at the front desk. You can")
    assert repeated_start(again, committed) == 16
    agreement = LocalAgreement()
    agreement.flush([Word(f" {k}", i * 0.3, i * 0.3 + 0.2, 0.9) for i, k in enumerate(committed)])
    hypothesis = [Word(f" {k}", 20 + i * 0.3, 20 + i * 0.3 + 0.2, 0.9) for i, k in enumerate(again)]
    agreement.update(hypothesis)
    assert [w.key for w in agreement.pending] == ["you", "can"] and agreement.repeats_dropped == 16


def test_speech_that_only_shares_a_few_words_with_what_came_before_is_kept() -> None:
    before = keys("and the man is standing by the gate")
    assert repeated_start(keys("and the dog is barking at the gate"), before) == 0  # 6 of 8 alike: too few
    assert repeated_start(keys("the gate is open"), before) == 0  # shorter than a repeat
    assert repeated_start(keys("is standing by the gate now"), keys("the man is standing by the gate")) == 0
    assert repeated_start(keys("a b c d e f"), keys("x a b c d e f")) == 6  # six words said again exactly


def test_a_sentence_said_twice_in_a_row_keeps_one_copy_and_what_follows() -> None:
    text = ("the order contains pair batteries. we are open on weekends during office hours. "
            "we are open on weekends during office hours. you can reach me by email.")
    words = [Word(f" {w}", i * 0.3, i * 0.3 + 0.2, 0.9) for i, w in enumerate(text.split())]
    kept = " ".join(w.key for w in drop_repeated_sentences(words))
    assert kept == ("the order contains pair batteries we are open on weekends during office hours "
                    "you can reach me by email")
    short = [Word(f" {w}", 0, 0, 0.9) for w in ["no", "no", "we", "said", "no", "no"]]
    assert drop_repeated_sentences(short) == short  # short repeats are speech (or the loop guard's)
