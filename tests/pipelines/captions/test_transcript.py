"""The transcript's pure parts: an utterance's audio and segments, where a long one is cut into
pieces, and how captions read back once transcripts replace them."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.captions.agreement import Word
from pipelines.captions.transcript import (
    MIN_PIECE_S,
    PIECE_MAX_S,
    WHISPER_MAX_S,
    Segment,
    UtteranceRecorder,
    kept_text,
    piece_cut,
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
    assert piece.start == pytest.approx(10.0) and piece.end == pytest.approx(14.3)
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


def test_a_long_utterance_is_cut_after_a_sentence_into_pieces_that_replace_whole_segments() -> None:
    recorder = UtteranceRecorder()
    feed(recorder, 0.0, PIECE_MAX_S - 1)
    recorder.add("r-0", words("the gate stopped lifting.", 1.0))  # ends a sentence at 2.5 s: too early
    recorder.add("r-1", words("a technician replaced the motor board.", 6.0))  # ends 8.3 s
    recorder.add("r-2", words("please keep an eye on it", 12.0))
    assert recorder.due(pending_start=None) is None  # not long enough yet
    feed(recorder, PIECE_MAX_S - 1, 2.0)
    piece = recorder.due(pending_start=15.0)
    assert piece is not None
    assert [s.segment_id for s in piece.segments] == ["r-0", "r-1"]
    # Cut in the gap after the sentence's last word, at most CUT_PAD_S after it.
    assert piece.end == pytest.approx(8.3 + 0.15)
    assert piece.audio.shape[0] == round(piece.end * RATE)
    assert piece.audio[-1] < piece.end <= recorder.audio.start + 1 / RATE
    assert [s.segment_id for s in recorder.segments] == ["r-2"]
    rest = recorder.finish()
    assert rest is not None and rest.start == pytest.approx(piece.end)


def test_where_a_piece_is_cut() -> None:
    def seg(name: str, text: str, start: float) -> Segment:
        return Segment(name, tuple(words(text, start)))

    sentence = seg("a", "it works.", MIN_PIECE_S + 1)  # ends MIN_PIECE_S + 1.7
    running = seg("b", "and then", MIN_PIECE_S + 3)
    assert piece_cut([], 0.0, pending_start=None) is None
    index, cut = piece_cut([sentence, running], 0.0, pending_start=None)  # type: ignore[misc]
    assert index == 0 and cut == pytest.approx(sentence.end + 0.15)
    # No sentence far enough in: after the newest segment, half-way to the words still pending.
    index, cut = piece_cut([seg("c", "no stop here", 1.0)], 0.0, pending_start=2.2)  # type: ignore[misc]
    assert index == 0 and cut == pytest.approx(1.0 + 0.8 + 0.3 + (2.2 - 2.1) / 2)


def test_speech_with_nothing_final_for_whispers_whole_window_is_bounded_and_counted() -> None:
    recorder = UtteranceRecorder()
    feed(recorder, 0.0, WHISPER_MAX_S + 1)
    assert recorder.due(pending_start=None) is None
    assert recorder.audio.duration == pytest.approx(PIECE_MAX_S)
    assert recorder.untranscribed_s == pytest.approx(WHISPER_MAX_S + 1 - PIECE_MAX_S)


def test_the_prompt_keeps_the_transcripts_tail() -> None:
    recorder = UtteranceRecorder()
    for i in range(200):
        recorder.remember(f"sentence number {i}.")
    assert recorder.text.endswith("sentence number 199.") and len(recorder.text) <= 1024


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
