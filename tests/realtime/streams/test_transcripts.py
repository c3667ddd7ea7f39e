"""captions.vtt's store: finals as cues, each utterance's transcript in their place once it comes,
cut into sentence cues; bounded by age and count."""

from __future__ import annotations

from pipelines.event_bodies import caption_event, transcript_event
from pipelines.events import Event
from realtime.streams.transcripts import CUE_MAX_WORDS, TranscriptStore, to_webvtt
from tests.support.bodies import any_event


def said(text: str, start: float, step: float = 0.5) -> list[tuple[str, float, float, float]]:
    return [(f" {w}", start + i * step, start + i * step + 0.4, 0.9) for i, w in enumerate(text.split())]


def final(stream: str, segment: str, text: str, start: float) -> Event:
    return caption_event(stream, segment_id=segment, words=said(text, start), language="en", model="m",
                         captured_at=0.0)


def transcript(stream: str, replaces: list[str], text: str, start: float) -> Event:
    words = said(text, start)
    return transcript_event(stream, utterance_id="u1", replaces=replaces, words=words, start=start,
                            end=words[-1][2], revised=True, changed=True, language="en", model="m", captured_at=0.0)


def test_a_transcript_takes_the_place_of_its_finals_as_sentence_cues() -> None:
    store = TranscriptStore()
    store.tap(final("cam", "a", "good evening", 1.0))
    store.tap(final("cam", "b", "this is the hand over.", 2.0))
    store.tap(final("cam", "c", "the day", 6.0))  # the next utterance, not transcribed yet
    store.tap(final("other", "a", "another stream", 1.0))
    store.tap(transcript("cam", ["a", "b"], "Good evening. This is the handover.", 1.0))
    assert [c.text for c in store.cues("cam")] == ["Good evening.", "This is the handover.", "the day"]
    assert [c.text for c in store.cues("other")] == ["another stream"]
    vtt = to_webvtt(store.cues("cam"))
    assert vtt.startswith("WEBVTT\n\n1\n00:00:01.000 --> 00:00:01.900\nGood evening.\n")


def test_a_long_transcript_is_cut_into_cues_of_bounded_length() -> None:
    store = TranscriptStore()
    store.tap(final("cam", "a", "word " * 40, 0.0))
    store.tap(transcript("cam", ["a"], " ".join(f"w{i}" for i in range(40)), 0.0))
    cues = store.cues("cam")
    assert [len(c.text.split()) for c in cues] == [CUE_MAX_WORDS, CUE_MAX_WORDS, 40 - 2 * CUE_MAX_WORDS]
    assert cues[1].start == 0.5 * CUE_MAX_WORDS


def test_cues_older_than_the_age_bound_fall_off_and_unreadable_events_are_ignored() -> None:
    store = TranscriptStore(max_age_s=10.0)
    store.tap(final("cam", "a", "old words", 0.0))
    store.tap(final("cam", "b", "new words", 20.0))
    broken = transcript("cam", ["a"], "x", 0.0)
    store.tap(any_event(broken.kind, "cam", {"words": "nonsense"}, pts=0.0, captured_at=0.0))  # not a transcript body
    assert [c.text for c in store.cues("cam")] == ["new words"]
    store.forget("cam")
    assert store.cues("cam") == []


def test_cues_are_kept_per_language_and_the_english_track_beside_them() -> None:
    from pipelines.event_bodies import translation_event

    store = TranscriptStore()
    words = said("hola a todos", 1.0)
    store.tap(transcript_event("cam", utterance_id="u1", replaces=[], words=words, start=1.0, end=words[-1][2],
                               revised=True, changed=False, language="es", model="base", captured_at=0.0))
    store.tap(final("cam", "b", "good evening", 5.0))
    store.tap(translation_event("cam", utterance_id="u1", text="Hello everyone", start=1.0, end=2.4,
                                spoken_language="es", model="base", captured_at=0.0))
    assert [c.text for c in store.cues("cam", "es")] == ["hola a todos"]
    assert [c.text for c in store.cues("cam", "en")] == ["good evening"]
    assert [c.text for c in store.cues("cam")] == ["hola a todos", "good evening"]
    assert to_webvtt(store.translations("cam")).endswith("00:00:01.000 --> 00:00:02.400\nHello everyone\n")
    assert store.languages("cam") == {"spoken": ["en", "es"], "translations": ["en"]}
    store.forget("cam")
    assert store.translations("cam") == [] and store.languages("cam") == {"spoken": [], "translations": []}
