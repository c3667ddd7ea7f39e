"""The transcript's pure parts: an utterance's audio and segments, where a long one is cut into
pieces, and how captions read back once transcripts replace them."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.captions.agreement import Word
from pipelines.captions.transcript import (
    LEFT_CONTEXT_S,
    PIECE_MAX_S,
    PIECE_MIN_S,
    RIGHT_CONTEXT_S,
    WHISPER_MAX_S,
    Piece,
    Segment,
    UtteranceRecorder,
    after_prefix,
    forced_text,
    kept_text,
    piece_cut,
    unheard,
)
from pipelines.event_bodies import caption_event, transcript_event
from pipelines.events import Event

RATE = 16_000


def words(text: str, start: float, step: float = 0.4) -> list[Word]:
    return [Word(f" {w}", start + i * step, start + i * step + 0.3, 0.9) for i, w in enumerate(text.split())]


def feed(recorder: UtteranceRecorder, start: float, seconds: float) -> None:
    # Each sample holds its own time, so a piece's audio can be checked sample by sample.
    t = start + np.arange(int(seconds * RATE)) / RATE
    recorder.append(start, t.astype(np.float32))


def test_an_ended_utterance_is_one_piece_with_its_audio_and_segments() -> None:
    recorder = UtteranceRecorder()
    feed(recorder, 10.0, 0.3)
    recorder.idle(pre_roll_s=0.3)  # nobody speaks yet: only the pre-roll stays
    feed(recorder, 10.3, 4.0)
    recorder.add("r-0", words("good evening", 10.5))
    recorder.add("r-1", words("this is the handover.", 11.5))
    recorder.add("r-2", [])  # nothing committed: not a segment
    piece = recorder.finish()
    assert piece is not None
    assert [s.segment_id for s in piece.segments] == ["r-0", "r-1"]
    assert piece.start == piece.audio_start == pytest.approx(10.0) and piece.end == pytest.approx(14.3)
    assert piece.audio[0] == pytest.approx(10.0) and piece.audio.shape[0] == int(4.3 * RATE)
    assert [w.text for w in piece.finals] == [" good", " evening", " this", " is", " the", " handover."]
    assert recorder.finish() is None  # nothing said since


def test_the_idle_recorder_keeps_only_the_pre_roll_but_never_drops_a_spoken_segment() -> None:
    recorder = UtteranceRecorder()
    feed(recorder, 0.0, 5.0)
    recorder.idle(pre_roll_s=0.3)
    assert recorder.audio.duration == pytest.approx(0.3)
    recorder.add("r-0", words("hello", 5.0))
    feed(recorder, 5.0, 2.0)
    recorder.idle(pre_roll_s=0.3)  # a segment waits for its transcript: its audio stays
    assert recorder.audio.duration == pytest.approx(2.3)


def test_speech_that_never_pauses_is_cut_after_a_sentence_into_pieces_that_replace_whole_segments() -> None:
    recorder = UtteranceRecorder()
    feed(recorder, 0.0, 3.0)
    recorder.add("r-0", words("the gate", 0.2))  # ends 0.9 s
    assert recorder.due(pending_start=1.2) is None  # too short for a piece
    recorder.add("r-1", words("stopped lifting.", 1.2))  # a sentence ending at 1.9 s: still too short
    assert recorder.due(pending_start=2.2) is None
    feed(recorder, 3.0, 1.5)
    recorder.add("r-2", words("a technician", 2.2))
    recorder.add("r-3", words("replaced it.", 3.2))  # ends a sentence 3.9 s in
    assert recorder.due(pending_start=4.4) is None  # 0.6 s of audio after it: not the context its end needs
    feed(recorder, 4.5, 2.0)
    recorder.add("r-4", words("please", 4.4))
    piece = recorder.due(pending_start=5.0)
    assert piece is not None
    assert [s.segment_id for s in piece.segments] == ["r-0", "r-1", "r-2", "r-3"]
    assert piece.start == 0.0 and piece.end == pytest.approx(3.9 + 0.15)  # in the gap after its last word
    # Its decode hears what follows the cut, up to RIGHT_CONTEXT_S.
    assert piece.audio_start == 0.0
    assert piece.audio.shape[0] == round((piece.end + RIGHT_CONTEXT_S) * RATE)
    # The recorder keeps LEFT_CONTEXT_S of the piece as the next one's context; that one starts at the cut.
    assert recorder.audio.start == pytest.approx(piece.end - LEFT_CONTEXT_S, abs=1 / RATE)
    assert recorder.start == piece.end and [s.segment_id for s in recorder.segments] == ["r-4"]
    rest = recorder.finish()
    assert rest is not None and rest.start == piece.end and rest.end == pytest.approx(6.5)
    assert rest.audio_start == pytest.approx(piece.end - LEFT_CONTEXT_S, abs=1 / RATE)
    assert recorder.cut is None and recorder.audio.duration == 0  # the next utterance starts afresh


def test_where_a_piece_is_cut() -> None:
    def seg(name: str, text: str, start: float) -> Segment:
        return Segment(name, tuple(words(text, start)))

    assert piece_cut([], 0.0, pending_start=None) is None
    sentence = seg("a", "it works.", PIECE_MIN_S)  # ends PIECE_MIN_S + 0.7
    running = seg("b", "and then", PIECE_MIN_S + 1)
    index, cut = piece_cut([sentence, running], 0.0, pending_start=None)  # type: ignore[misc]
    assert index == 0 and cut == pytest.approx(sentence.end + 0.15)
    early = seg("a", "it works.", 0.5)  # a sentence that ends before PIECE_MIN_S is no place to cut
    assert piece_cut([early, seg("b", "and then", 1.4)], 0.0, pending_start=2.5) is None
    # No sentence and PIECE_MAX_S of speech: after the segment followed by the widest gap, among
    # those of the last GAP_CHOICE_S.
    m = PIECE_MAX_S
    no_stop = [seg("c", "no stop", m - 2.5), seg("d", "here at", m - 1.6), seg("e", "all", m - 0.4)]  # gaps 0.2, 0.5
    assert piece_cut(no_stop, 0.0, pending_start=m + 0.1) is None  # not PIECE_MAX_S yet
    no_stop.append(seg("f", "today", m))  # 0.1 s after "all"
    index, cut = piece_cut(no_stop, 0.0, pending_start=m + 0.6)  # type: ignore[misc]
    # "today" and the pause after it (0.3 s), not the wider one after "here at": the words after that
    # would wait for a piece more.
    assert index == 3 and cut == pytest.approx(m + 0.3 + 0.15)
    early_gap = [seg("c", "no stop", 1.5), seg("d", "here at", 2.8), seg("e", "all", 3.6), seg("f", "to", 4.1)]
    index, _ = piece_cut(early_gap, 0.0, pending_start=4.45)  # type: ignore[misc]
    assert index == 2  # gaps 0.6 after "no stop" (too early), then 0.1, 0.2 and 0.05: the widest of the last second
    # Only segments with `heard_to` audio after them: the decode hears what follows the piece's last words.
    assert piece_cut([sentence, running], 0.0, pending_start=None, heard_to=sentence.end - 0.1) is None
    assert piece_cut(no_stop, 0.0, pending_start=PIECE_MAX_S + 1.5, heard_to=PIECE_MAX_S) is None


def test_a_piece_hears_the_transcripts_last_words_again_as_its_forced_prefix() -> None:
    recorder = UtteranceRecorder()
    recorder.remember(words("earlier words.", 0.0))
    recorder.remember(words("the gate stopped lifting", 3.0))  # 3.0-3.3, 3.4-3.7, 3.8-4.1, 4.2-4.5
    piece = Piece(np.zeros(int(4 * RATE), np.float32), 3.5, 4.6, 7.5, ())
    begin, prefix = recorder.context(piece)
    # "stopped" is the first transcript word wholly inside the audio: the decode starts in the gap before it.
    assert [w.text for w in prefix] == [" stopped", " lifting"]
    assert begin == pytest.approx((3.7 + 3.8) / 2)
    assert recorder.prompt(prefix) == "earlier words. the gate"
    # At an utterance's start no transcript word lies in its audio: no prefix, the audio from its start.
    assert recorder.context(Piece(np.zeros(RATE, np.float32), 9.0, 9.0, 10.0, ())) == (9.0, [])
    assert recorder.prompt([]) == recorder.text


def test_the_prefix_is_forced_without_its_last_punctuation() -> None:
    assert forced_text(words("nobody is standing closed.", 0.0)) == "nobody is standing closed"
    assert forced_text(words("well, then", 0.0)) == "well, then" and forced_text([]) == ""


def test_the_words_after_the_forced_prefix_are_found_by_their_letters() -> None:
    prefix = words("stopped lifting", 3.8)
    decoded = [Word(" stopped", 3.8, 4.1, 0.9), Word(" lifting.", 4.2, 4.5, 0.9), Word(" A", 4.7, 4.8, 0.9)]
    assert [w.text for w in after_prefix(decoded, prefix)] == [" A"]
    assert after_prefix(decoded, []) == decoded
    assert after_prefix(decoded[:2], prefix) == []  # the decode said nothing more


def test_the_finals_a_decode_left_out_are_found_even_under_a_stretched_last_word() -> None:
    said = "platform two please allow extra time to reach it"
    finals = words(said, 17.0)  # a word every 0.4 s
    assert unheard(finals, words(said, 17.1)) == []  # times a little off
    assert unheard(finals, words("platform two allow extra time to reach it", 17.0)) == []  # one word: tolerated
    skipped = unheard(finals, words("platform two", 17.0) + words("reach it", 19.8))
    assert [w.text for w in skipped] == [" allow", " extra", " time"]
    # A decode that stopped early: its last word aligned over the audio it did not transcribe.
    stopped = [Word(" platform", 17.0, 17.3, 0.9), Word(" two.", 17.4, 20.5, 0.4)]
    assert [w.text for w in unheard(finals, stopped)] == [w.text for w in finals[2:]]


def test_speech_with_nothing_final_for_whispers_whole_window_is_bounded_and_counted() -> None:
    recorder = UtteranceRecorder()
    feed(recorder, 0.0, WHISPER_MAX_S + 1)
    assert recorder.due(pending_start=None) is None
    kept = WHISPER_MAX_S - LEFT_CONTEXT_S
    assert recorder.audio.duration == pytest.approx(kept)
    assert recorder.untranscribed_s == pytest.approx(WHISPER_MAX_S + 1 - kept)


def test_the_prompt_keeps_the_transcripts_tail() -> None:
    recorder = UtteranceRecorder()
    for i in range(200):
        recorder.remember(words(f"sentence number {i}.", i))
    assert recorder.text.endswith("sentence number 199.") and len(recorder.text) <= 1024
    assert len(recorder.heard) < 200  # its words with their times: as many as a prefix may need


def caption(segment: str, text: str, start: float) -> Event:
    ws = [(w.text, w.start, w.end, w.probability) for w in words(text, start)]
    return caption_event("cam", segment_id=segment, words=ws, language="en", model="tiny.en", captured_at=0.0)


def transcript(utterance: str, replaces: list[str], text: str, start: float) -> Event:
    ws = [(w.text, w.start, w.end, w.probability) for w in words(text, start)]
    return transcript_event("cam", utterance_id=utterance, replaces=replaces, words=ws, start=start,
                            end=ws[-1][2], revised=True, changed=True, language="en", model="tiny.en",
                            captured_at=0.0)


def test_captions_read_back_with_each_transcript_in_place_of_its_finals() -> None:
    events = [
        caption("r-0", "since man", 0.0),
        caption("r-1", "the gate works.", 1.0),
        transcript("r-u1", ["r-0", "r-1"], "Since then the gate works.", 0.0),
        caption("r-2", "a dog", 5.0),  # its transcript has not come (yet)
    ]
    assert kept_text(events) == "Since then the gate works. a dog"
    body = events[2].data
    assert body["replaces"] == ["r-0", "r-1"] and body["text"] == "Since then the gate works."
    assert events[2].id == "transcript-cam-r-u1" and events[2].durable
