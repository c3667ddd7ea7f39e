"""The index on a real SQLite file: stemmed BM25 search, a caption hit on the matched word's time,
the clip that covers a hit, replays that add nothing twice, and the bounds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from realtime.timeline import index as index_module
from realtime.timeline.entries import Entry, NotIndexed, entry_of
from realtime.timeline.errors import QueryTooBroad, TimelineIndexError
from realtime.timeline.index import Filters, TimelineIndex
from realtime.timeline.query import parse
from tests.realtime.timeline.bodies import caption, clip, description, transcript, wire

NOW = time.time()


def entries(*events: object) -> list[tuple[int, Entry]]:
    out = []
    for seq, event in enumerate(events, 1):
        out.append((seq, entry_of(*wire(event))))  # type: ignore[arg-type]
    return out


@pytest.fixture
def index(tmp_path: Path) -> TimelineIndex:
    idx = TimelineIndex(tmp_path / "t.db", max_entries=10_000, max_age_s=86400)
    idx.add(entries(
        caption("cam1", "s1", "the parcel was delivered to the front door", 30.0, at=NOW - 60),
        caption("cam2", "s1", "nobody came to the door today", 5.0, at=NOW - 50),
        description("cam1", "A courier in a red jacket leaves a box by the door.", 28.0, 34.0, at=NOW - 58),
        clip("cam1", "c" * 32, 25.0, 40.0, at=NOW - 40),
    ), 4, now=NOW)
    return idx


def search(index: TimelineIndex, text: str, **filters: object) -> list[index_module.Hit]:
    hits, _ = index.search(parse(text), Filters(**filters), limit=10, offset=0)  # type: ignore[arg-type]
    return hits


def test_a_spoken_phrase_is_found_at_the_time_its_word_was_said(index: TimelineIndex) -> None:
    [hit] = search(index, '"front door"')
    assert (hit.stream_id, hit.kind) == ("cam1", "captions")
    # "front" is the 7th word: 30.0 + 6 * 0.4
    assert hit.pts == pytest.approx(32.4)
    assert hit.wall == pytest.approx(NOW - 60 + 2.4, abs=0.01)
    marked = [hit.snippet[a:b] for a, b in hit.marks]
    assert marked == ["front door"]  # a phrase is marked whole
    assert hit.clip is not None and hit.clip["clip_id"] == "c" * 32
    assert hit.clip["offset_s"] == pytest.approx(32.4 - 25.0)


def test_stemming_ranking_and_filters(index: TimelineIndex) -> None:
    assert {h.kind for h in search(index, "deliver")} == {"captions"}  # "delivered", stemmed
    assert {h.kind for h in search(index, "couriers jackets")} == {"descriptions"}
    hits = search(index, "door")
    assert {h.stream_id for h in hits} == {"cam1", "cam2"} and len(hits) == 3
    assert [h.stream_id for h in search(index, "door", streams=("cam2",))] == ["cam2"]
    assert [h.kind for h in search(index, "door", kinds=("descriptions",))] == ["descriptions"]
    assert [h.stream_id for h in search(index, "door", since=NOW - 55)] == ["cam2"]
    assert {h.stream_id for h in search(index, "door", until=NOW - 55)} == {"cam1"}
    assert search(index, "door -nobody -courier")[0].snippet.startswith("the parcel")
    assert search(index, "deliv*")[0].kind == "captions"


def test_a_replay_adds_nothing_twice_and_the_position_moves(index: TimelineIndex, tmp_path: Path) -> None:
    again = entries(caption("cam1", "s1", "the parcel was delivered to the front door", 30.0, at=NOW - 60))
    assert index.add(again, 9, now=NOW) == 0
    assert index.stats.duplicates == 1 and index.position == 9
    reopened = TimelineIndex(tmp_path / "t.db", max_entries=10_000, max_age_s=86400)
    assert reopened.position == 9 and reopened.stats.entries == 4


def test_finals_said_in_one_breath_are_one_entry(tmp_path: Path) -> None:
    idx = TimelineIndex(tmp_path / "u.db", max_entries=1000, max_age_s=86400)
    idx.add(entries(
        caption("cam", "a", "several people are", 10.0, at=NOW),  # words end at 10.32, 10.72, 11.12
        caption("cam", "b", "walking across the plaza.", 11.5, at=NOW + 1.5),  # 0.38 s later: the same breath
        caption("cam", "c", "a dog barks", 12.9, at=NOW + 3),  # after a sentence end: a new entry
        caption("cam", "d", "far away", 16.0, at=NOW + 6),  # after a 2 s pause: another
        caption("other", "e", "walking across", 11.6, at=NOW),  # another stream never joins
    ), 5, now=NOW)
    assert idx.stats.entries == 4
    [hit] = search(idx, '"are walking"', streams=("cam",))
    assert hit.pts == pytest.approx(10.8) and hit.end_pts == pytest.approx(11.5 + 3 * 0.4 + 0.32)
    assert hit.event_id == "caption-cam-a"
    [plaza] = search(idx, "plaza")
    assert plaza.pts == pytest.approx(11.5 + 3 * 0.4)  # the fourth word of the second piece
    assert {h.event_id for h in search(idx, "dog OR far")} == {"caption-cam-c", "caption-cam-d"}
    assert idx.add(entries(caption("cam", "b", "walking across the plaza.", 11.5, at=NOW + 1.5)), 6, now=NOW) == 0
    assert idx.stats.duplicates == 1  # a joined piece, read again, is still known


def test_a_transcript_replaces_its_finals_and_the_next_final_does_not_join_it(tmp_path: Path) -> None:
    idx = TimelineIndex(tmp_path / "r.db", max_entries=1000, max_age_s=86400)
    idx.add(entries(
        caption("cam", "z", "unrelated words", 2.0, at=NOW - 8),  # an utterance before
        caption("cam", "a", "the gate has worked", 10.0, at=NOW),
        caption("cam", "b", "since man", 11.6, at=NOW + 1.6),  # the same breath: one entry with "a"
    ), 3, now=NOW)
    assert idx.stats.entries == 2 and search(idx, "man")
    idx.add(entries(transcript("cam", "u1", ["a", "b"], "the gate has worked since then.", 10.0, at=NOW)), 4, now=NOW)
    assert search(idx, "man") == [] and idx.stats.entries == 2 and idx.stats.replaced == 1
    [hit] = search(idx, '"since then"')
    assert (hit.kind, hit.event_id) == ("captions", "transcript-cam-u1")
    assert hit.pts == pytest.approx(10.0 + 4 * 0.4)  # the matched word's own time
    assert [h.event_id for h in search(idx, "unrelated")] == ["caption-cam-z"]  # another utterance stays
    # The next final, though said within a breath of it, is not joined to a transcribed utterance.
    idx.add(entries(caption("cam", "c", "please log it", 12.5, at=NOW + 3)), 5, now=NOW)
    assert [h.event_id for h in search(idx, "log")] == ["caption-cam-c"]
    # A replay of the replaced finals (or of the transcript) adds nothing back.
    replay = entries(caption("cam", "a", "the gate has worked", 10.0, at=NOW),
                     caption("cam", "b", "since man", 11.6, at=NOW + 1.6),
                     transcript("cam", "u1", ["a", "b"], "the gate has worked since then.", 10.0, at=NOW))
    assert idx.add(replay, 8, now=NOW) == 0 and search(idx, "man") == []


def test_transcript_pieces_of_one_breath_are_one_entry(tmp_path: Path) -> None:
    """A speaker who does not pause is transcribed in pieces of a few seconds, cut mid-sentence
    where a sentence runs on: a phrase said across the cut is found, in one entry."""
    idx = TimelineIndex(tmp_path / "p.db", max_entries=1000, max_age_s=86400)
    idx.add(entries(
        caption("cam", "a", "the gate has worked since", 10.0, at=NOW),
        caption("cam", "b", "then it stopped.", 12.0, at=NOW + 2),
        caption("cam", "c", "call the desk", 13.3, at=NOW + 3.3),
    ), 3, now=NOW)
    idx.add(entries(transcript("cam", "u1", ["a"], "the gate has worked since", 10.0, at=NOW)), 4, now=NOW)
    # The finals ran ahead: the next piece's finals are indexed, but no transcript joins them.
    idx.add(entries(transcript("cam", "u2", ["b"], "then it stopped.", 12.0, at=NOW + 2)), 5, now=NOW)
    [hit] = search(idx, '"since then"')
    assert hit.event_id == "transcript-cam-u1" and hit.pts == pytest.approx(10.0 + 4 * 0.4)
    assert hit.end_pts == pytest.approx(12.0 + 2 * 0.4 + 0.32)
    idx.add(entries(transcript("cam", "u3", ["c"], "call the desk", 13.3, at=NOW + 3.3)), 6, now=NOW)
    assert [h.event_id for h in search(idx, "desk")] == ["transcript-cam-u3"]  # after a sentence end: its own
    assert idx.stats.entries == 2 and search(idx, "stopped")[0].event_id == "transcript-cam-u1"


def test_old_and_surplus_entries_are_pruned_and_counted(tmp_path: Path) -> None:
    idx = TimelineIndex(tmp_path / "p.db", max_entries=500, max_age_s=100)
    # Walls from 150 s to 40 s ago: the older half goes for age, then the oldest past 500 for count.
    events = [caption("cam", f"s{i}", f"word{i} spoken.", float(i), at=NOW - 150.05 + i * 0.1) for i in range(1100)]
    idx.add(entries(*events), 1100, now=NOW)
    assert idx.stats.entries == 500 and idx.stats.pruned == 600
    assert search(idx, "word599") == [] and len(search(idx, "word600")) == 1


def test_a_query_past_the_time_limit_is_refused(index: TimelineIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "QUERY_TIME_LIMIT_S", -1.0)
    monkeypatch.setattr(index_module, "PROGRESS_STEPS", 1)
    with pytest.raises(QueryTooBroad, match="too much"):
        search(index, "door")


def test_paging(index: TimelineIndex) -> None:
    first, more = index.search(parse("door"), Filters(), limit=2, offset=0)
    rest, more_after = index.search(parse("door"), Filters(), limit=2, offset=2)
    assert more and not more_after and len(first) == 2 and len(rest) == 1
    assert {h.event_id for h in first}.isdisjoint(h.event_id for h in rest)


def test_track_updates_and_unreadable_bodies_are_not_kept() -> None:
    with pytest.raises(NotIndexed):
        entry_of("x", "tracks", {"stream_id": "cam", "captured_at": NOW, "event": "update", "class": "person"})
    with pytest.raises(NotIndexed):
        entry_of("x", "captions", {"stream_id": "cam", "captured_at": "yesterday", "text": "hi"})
    with pytest.raises(NotIndexed):
        entry_of("x", "detections", {"stream_id": "cam", "captured_at": NOW})
    ended = entry_of("t", "tracks", {"stream_id": "cam", "captured_at": NOW, "event": "end", "class": "person",
                                     "track_id": 7, "first_seen_pts": 1.0, "last_seen_pts": 13.0})
    assert ended.text == "person track 7 seen for 12 s" and ended.pts == 1.0


def test_a_file_that_is_not_an_index_says_what_to_do(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(TimelineIndexError, match="delete the file"):
        TimelineIndex(bad, max_entries=1000, max_age_s=100)


def test_a_since_filter_skips_old_entries_exactly_even_when_they_arrive_out_of_order(tmp_path: Path) -> None:
    import random

    rng = random.Random(3)
    walls = [NOW - 5000 + i + rng.uniform(-400, 400) for i in range(4000)]  # late and early arrivals
    idx = TimelineIndex(tmp_path / "s.db", max_entries=100_000, max_age_s=86400)
    events = [caption("cam", f"s{i}", f"needle number{i}.", float(i), at=wall) for i, wall in enumerate(walls)]
    idx.add(entries(*events), len(events), now=NOW)
    since = NOW - 2500
    hits, _ = idx.search(parse("needle"), Filters(since=since), limit=100, offset=0, order="newest")
    expected = sum(1 for w in walls if w >= since)
    found: set[str] = set()
    offset = 0
    while True:
        page, more = idx.search(parse("needle"), Filters(since=since), limit=100, offset=offset, order="newest")
        found.update(h.event_id for h in page)
        if not more:
            break
        offset += 100
    assert len(found) == expected and all(h.wall >= since for h in hits)


def test_a_word_is_found_in_the_spoken_track_and_in_the_english_one(tmp_path: Path) -> None:
    from pipelines.event_bodies import transcript_event, translation_event

    idx = TimelineIndex(tmp_path / "l.db", max_entries=1000, max_age_s=86400)
    spanish = ["el", "tren", "sale", "a", "las", "diez"]
    words = [(f" {w}", 10.0 + i * 0.4, 10.3 + i * 0.4, 0.9) for i, w in enumerate(spanish)]
    said = transcript_event("cam", utterance_id="u1", replaces=[], words=words, start=10.0, end=words[-1][2],
                            revised=True, changed=False, language="es", model="base", captured_at=NOW)
    english = translation_event("cam", utterance_id="u1", text="The train leaves at ten.", start=10.0,
                                end=words[-1][2], spoken_language="es", model="base", captured_at=NOW + 2)
    idx.add(entries(said, english), 2, now=NOW)
    [spanish] = search(idx, "tren")
    assert spanish.kind == "captions" and spanish.extra["language"] == "es"
    [translated] = search(idx, "train")
    assert translated.kind == "translations" and translated.pts == pytest.approx(10.0)
    assert translated.extra["spoken_language"] == "es"
    assert {h.kind for h in search(idx, "train", kinds=("translations",))} == {"translations"}
