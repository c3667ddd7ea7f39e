"""The timeline index: one SQLite file with an FTS5 table (BM25 ranking, Porter stemming).

Entries are written by one indexer in batches; each batch commits the entries and the JetStream
sequence it ends at in one transaction, so the file always says exactly how far it got: a crash
loses no entry and re-reading from that sequence doubles none (event ids are unique as well, so
a replay of events already kept is skipped). A missing file is a new, empty index, which the
indexer fills again from JetStream.

Bounded: entries older than `max_age_s` and past `max_entries` (the oldest first) are deleted
after each batch and counted. Queries run on their own connections (WAL: readers never wait for
the writer) under a time limit, so one that would rank half the index is refused, not served
slowly to everyone.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.captions.utterances import SENTENCE_STOPS, UTTERANCE_PAUSE_S
from pipelines.events import EventKind
from realtime.timeline.entries import Entry
from realtime.timeline.errors import QueryTooBroad, TimelineIndexError
from realtime.timeline.query import Query

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
MAX_LIMIT = 100
MAX_OFFSET = 10_000
QUERY_TIME_LIMIT_S = 2.0
PROGRESS_STEPS = 10_000  # SQLite VM steps between looks at the clock
SNIPPET_TOKENS = 16
UTTERANCE_MAX_WORDS = 40  # an entry that runs on is cut here (as `vidsentry run` cuts its lines)
RANK_WINDOW = 50_000  # relevance ranks the newest this many matches: a common word stays fast
MARK_EVERY = 1024  # entries between two wall-time marks (see _since_bound)
MARK_OPEN, MARK_CLOSE = "\ue000", "\ue001"  # private-use characters: never in indexed text

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries(
    id INTEGER PRIMARY KEY,
    event_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    stream TEXT NOT NULL,
    kind TEXT NOT NULL,
    pts REAL,
    end_pts REAL,
    wall REAL NOT NULL,
    text TEXT NOT NULL,
    extra TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events(event_id TEXT PRIMARY KEY, entry INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_entry ON events(entry);
CREATE TABLE IF NOT EXISTS marks(id INTEGER PRIMARY KEY, max_wall REAL NOT NULL);
CREATE INDEX IF NOT EXISTS marks_wall ON marks(max_wall);
CREATE INDEX IF NOT EXISTS entries_wall ON entries(wall);
CREATE INDEX IF NOT EXISTS entries_span ON entries(stream, kind, pts);
CREATE VIRTUAL TABLE IF NOT EXISTS entries_fts USING fts5(
    text, content='entries', content_rowid='id', tokenize='porter unicode61 remove_diacritics 2', prefix='3'
);
CREATE TRIGGER IF NOT EXISTS entries_ai AFTER INSERT ON entries BEGIN
    INSERT INTO entries_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS entries_au AFTER UPDATE OF text ON entries BEGIN
    INSERT INTO entries_fts(entries_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO entries_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS entries_ad AFTER DELETE ON entries BEGIN
    INSERT INTO entries_fts(entries_fts, rowid, text) VALUES ('delete', old.id, old.text);
    DELETE FROM events WHERE entry = old.id;
END;
"""


@dataclass(frozen=True, slots=True)
class Filters:
    streams: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    since: float | None = None  # epoch seconds (wall time)
    until: float | None = None


@dataclass(slots=True)
class Hit:
    event_id: str
    stream_id: str
    kind: str
    pts: float | None  # the matched word's start for a caption, else the entry's start
    end_pts: float | None
    wall: float
    snippet: str  # the text around the match, plain
    marks: list[tuple[int, int]]  # [start, end) of each matched token in `snippet`
    score: float
    clip: dict[str, Any] | None = None  # the clip covering `pts`, when one does
    text: str = ""  # the entry's whole text
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class IndexStats:
    entries: int = 0
    indexed: int = 0  # since start
    duplicates: int = 0  # events already kept (a replay)
    pruned: int = 0  # deleted for age or count
    replaced: int = 0  # caption entries a transcript replaced
    queries: int = 0
    refused: int = 0  # too broad, or the syntax


def connect(path: Path | str, *, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, timeout=5.0)
    else:
        conn = sqlite3.connect(path, check_same_thread=False, timeout=5.0)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
    return conn


class TimelineIndex:
    """The writer's side and the queries. Writes come from one task at a time (the indexer);
    queries may run on any thread."""

    def __init__(self, path: Path, *, max_entries: int, max_age_s: float) -> None:
        self.path = path
        self.max_entries = max_entries
        self.max_age_s = max_age_s
        self.stats = IndexStats()
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = connect(path)
            self._db.executescript(_SCHEMA)
            version = self._meta("schema")
            if version is None:
                self._set_meta("schema", str(SCHEMA_VERSION))
                self._db.commit()
            elif int(version) != SCHEMA_VERSION:
                raise TimelineIndexError(f"{path}: index schema {version}, this version reads {SCHEMA_VERSION}; "
                                  "delete the file and it is rebuilt from JetStream")
            self.stats.entries = self._count()
            row = self._db.execute("SELECT max(id), max(wall) FROM entries").fetchone()
            self._last_id, self._max_wall = int(row[0] or 0), float(row[1] or 0.0)
        except sqlite3.DatabaseError as exc:
            raise TimelineIndexError(f"{path}: {exc}; delete the file and it is rebuilt from JetStream") from None
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    # -- the indexer's side --------------------------------------------------------------------

    @property
    def position(self) -> int:
        """The last JetStream sequence whose event is kept (or skipped); 0 for a new index."""
        return int(self._meta("position") or 0)

    @property
    def source(self) -> str | None:
        """Which JetStream stream `position` counts in (its creation time): a new stream starts at 1."""
        return self._meta("source")

    def restart_from_zero(self, source: str) -> None:
        """The stream was made again: sequences restart. Kept entries stay (their ids dedupe a replay)."""
        with self._lock:
            self._set_meta("position", "0")
            self._set_meta("source", source)
            self._db.commit()

    def add(self, entries: Sequence[tuple[int, Entry]], position: int, *, now: float | None = None) -> int:
        """Keep `entries` (each with its JetStream sequence) and move the position to `position`,
        in one transaction; then prune. Returns how many entries were made (a caption that
        continues its stream's utterance joins that entry instead)."""
        with self._lock:
            added = 0
            db = self._db
            for seq, e in entries:
                if db.execute("SELECT 1 FROM events WHERE event_id = ?", (e.event_id,)).fetchone() is not None:
                    self.stats.duplicates += 1  # a replay of an event already kept
                    continue
                if e.replaces:
                    self._withdraw(e.replaces)
                entry_id = self._continue_utterance(e) if e.kind is EventKind.CAPTIONS else None
                if entry_id is None:
                    entry_id = db.execute(
                        "INSERT INTO entries(event_id, seq, stream, kind, pts, end_pts, wall, text, extra) "
                        "VALUES (?,?,?,?,?,?,?,?,?)",
                        (e.event_id, seq, e.stream_id, e.kind.value, e.pts, e.end_pts, e.wall, e.text,
                         json.dumps(e.extra, separators=(",", ":"))),
                    ).lastrowid
                    added += 1
                    self._max_wall = max(self._max_wall, e.wall)
                    if entry_id is not None and entry_id // MARK_EVERY != self._last_id // MARK_EVERY:
                        # Every entry up to here has a wall time at most max_wall.
                        db.execute("INSERT OR REPLACE INTO marks(id, max_wall) VALUES (?, ?)",
                                   (entry_id, self._max_wall))
                    self._last_id = entry_id or self._last_id
                db.execute("INSERT INTO events(event_id, entry) VALUES (?, ?)", (e.event_id, entry_id))
                # The replaced captions stay known, so a replay of them is skipped as a duplicate.
                db.executemany("INSERT OR REPLACE INTO events(event_id, entry) VALUES (?, ?)",
                               [(replaced, entry_id) for replaced in e.replaces])
            self._set_meta("position", str(position))
            db.commit()
            self.stats.indexed += added
            self.stats.entries += added
            self._prune(time.time() if now is None else now)
        return added

    def _withdraw(self, caption_ids: Sequence[str]) -> None:
        """Delete the entries made of these captions: a transcript of their speech replaces them.
        Captions join captions only (a transcript joins transcripts), so such an entry holds no one
        else's words, except the head of the next piece, whose own transcript brings those back."""
        marks = ",".join("?" * len(caption_ids))
        rows = self._db.execute(f"SELECT DISTINCT entry FROM events WHERE event_id IN ({marks})",
                                list(caption_ids)).fetchall()
        withdrawn = 0
        for (entry_id,) in rows:
            withdrawn += self._db.execute("DELETE FROM entries WHERE id = ?", (entry_id,)).rowcount
        self.stats.entries -= withdrawn
        self.stats.replaced += withdrawn

    def _continue_utterance(self, e: Entry) -> int | None:
        """Finals come in pieces of a few words, and a speaker who does not pause is transcribed in
        pieces of a few seconds: one that follows its stream's last of the same (a final the last
        final, a transcript the last transcript) within a pause, with no sentence end between, joins
        it, so a phrase said across pieces is found. Finals run ahead of the transcript that
        replaces them, so the two are never joined."""
        transcript = bool(e.extra.get("transcript"))
        row = self._db.execute(
            "SELECT id, end_pts, text, extra FROM entries WHERE stream = ? AND kind = 'captions' "
            "AND (json_extract(extra, '$.transcript') IS NOT NULL) = ? ORDER BY pts DESC LIMIT 1",
            (e.stream_id, transcript)).fetchone()  # fmt: skip
        if row is None or e.pts is None or row[1] is None:
            return None
        entry_id, end, text, extra_json = row
        extra = json.loads(extra_json)
        words = extra.get("times") or []
        new_words = list(e.extra.get("times") or ())
        if (not 0.0 <= e.pts - end < UTTERANCE_PAUSE_S or text.endswith(SENTENCE_STOPS)
                or len(words) + len(new_words) > UTTERANCE_MAX_WORDS):
            return None
        extra["times"] = words + new_words
        self._db.execute("UPDATE entries SET text = ?, end_pts = ?, extra = ? WHERE id = ?",
                         (f"{text} {e.text}", e.end_pts, json.dumps(extra, separators=(",", ":")), entry_id))
        return int(entry_id)

    def _prune(self, now: float) -> None:
        pruned = self._db.execute("DELETE FROM entries WHERE wall < ?", (now - self.max_age_s,)).rowcount
        over = self.stats.entries - pruned - self.max_entries
        if over > 0:
            pruned += self._db.execute(
                "DELETE FROM entries WHERE id IN (SELECT id FROM entries ORDER BY id LIMIT ?)", (over,)).rowcount
        if pruned:
            self._db.commit()
            self.stats.pruned += pruned
            self.stats.entries -= pruned

    # -- queries -------------------------------------------------------------------------------

    def search(self, query: Query, filters: Filters, *, limit: int, offset: int,
               order: str = "relevance") -> tuple[list[Hit], bool]:
        """Hits best first (BM25 over the newest `RANK_WINDOW` matches) or newest first, and
        whether more follow. QueryTooBroad past the time limit."""
        where, params = _filters(filters)
        fts = query.fts()
        conn = connect(self.path, readonly=True)
        try:
            deadline = time.monotonic() + QUERY_TIME_LIMIT_S
            bounds: list[str] = []
            bound_params: list[Any] = []
            if filters.since is not None:  # entries older than `since` are skipped inside FTS5
                floor = _since_bound(conn, filters.since)
                if floor:
                    bounds.append("entries_fts.rowid > ?")
                    bound_params.append(floor)
            if order == "relevance":
                window = _timed(conn, "SELECT rowid FROM entries_fts WHERE entries_fts MATCH ?"
                                + "".join(f" AND {b}" for b in bounds) + " ORDER BY rowid DESC LIMIT 1 OFFSET ?",
                                [fts, *bound_params, RANK_WINDOW - 1], deadline)
                if window:
                    bounds.append("entries_fts.rowid >= ?")
                    bound_params.append(window[0][0])
            sql = (
                "SELECT e.id, e.event_id, e.stream, e.kind, e.pts, e.end_pts, e.wall, e.extra, e.text, "
                f"bm25(entries_fts), snippet(entries_fts, 0, '{MARK_OPEN}', '{MARK_CLOSE}', '…', {SNIPPET_TOKENS}), "
                f"CASE WHEN e.kind = 'captions' THEN highlight(entries_fts, 0, '{MARK_OPEN}', '{MARK_CLOSE}') END "
                "FROM entries_fts JOIN entries e ON e.id = entries_fts.rowid "
                f"WHERE entries_fts MATCH ?{''.join(f' AND {b}' for b in bounds)}{where} "
                f"ORDER BY {'bm25(entries_fts)' if order == 'relevance' else 'entries_fts.rowid DESC'} "
                "LIMIT ? OFFSET ?"
            )
            rows = _timed(conn, sql, [fts, *bound_params, *params, limit + 1, offset], deadline)
            hits = [_hit(row) for row in rows[:limit]]
            for hit in hits:
                hit.clip = _covering_clip(conn, hit)
        finally:
            conn.close()
        self.stats.queries += 1
        return hits, len(rows) > limit

    def known(self, event_ids: Iterable[str]) -> set[str]:
        """Which of these events the index has kept (each joins an entry)."""
        ids = list(event_ids)
        conn = connect(self.path, readonly=True)
        try:
            found: set[str] = set()
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                rows = conn.execute(f"SELECT event_id FROM events WHERE event_id IN ({','.join('?' * len(chunk))})",
                                    chunk).fetchall()
                found.update(row[0] for row in rows)
            return found
        finally:
            conn.close()

    def _count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM entries").fetchone()[0])

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = ?",
                         (key, value, value))


def _filters(filters: Filters) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if filters.streams:
        clauses.append(f"e.stream IN ({','.join('?' * len(filters.streams))})")
        params += filters.streams
    if filters.kinds:
        clauses.append(f"e.kind IN ({','.join('?' * len(filters.kinds))})")
        params += filters.kinds
    if filters.since is not None:
        clauses.append("e.wall >= ?")
        params.append(filters.since)
    if filters.until is not None:
        clauses.append("e.wall <= ?")
        params.append(filters.until)
    return "".join(f" AND {c}" for c in clauses), params


def _timed(conn: sqlite3.Connection, sql: str, params: Iterable[Any], deadline: float) -> list[Any]:
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), PROGRESS_STEPS)
    try:
        return conn.execute(sql, list(params)).fetchall()
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc):
            raise QueryTooBroad(f"the query matches too much to rank within {QUERY_TIME_LIMIT_S:g} s") from None
        raise


def _since_bound(conn: sqlite3.Connection, since: float) -> int:
    """An entry id at or below which every entry is older than `since`, so FTS5 can skip them.

    Marks record, every MARK_EVERY entries, the newest wall time among all entries up to then;
    that maximum only grows with the id, so the last mark still below `since` bounds exactly
    (events that arrive late, with older wall times, only ever sit above it)."""
    row = conn.execute("SELECT max(id) FROM marks WHERE max_wall < ?", (since,)).fetchone()
    return int(row[0] or 0)


def _hit(row: Sequence[Any]) -> Hit:
    _, event_id, stream, kind, pts, end_pts, wall, extra_json, full, score, snippet, highlighted = row
    extra = json.loads(extra_json)
    text, marks = _split_marks(snippet)
    hit_pts = pts
    if highlighted is not None and extra.get("times"):
        hit_pts = _matched_word_start(highlighted, extra["times"], pts)
    shift = hit_pts - pts if hit_pts is not None and pts is not None else 0.0
    hit = Hit(event_id, stream, kind, hit_pts, end_pts, wall + shift, text, marks, -float(score), text=full)
    hit.extra = {k: v for k, v in extra.items() if k != "times"}
    return hit


def _split_marks(text: str) -> tuple[str, list[tuple[int, int]]]:
    out: list[str] = []
    marks: list[tuple[int, int]] = []
    length = 0
    opened = -1
    for ch in text:
        if ch == MARK_OPEN:
            opened = length
        elif ch == MARK_CLOSE:
            if opened >= 0:
                marks.append((opened, length))
            opened = -1
        else:
            out.append(ch)
            length += 1
    return "".join(out), marks


def _matched_word_start(highlighted: str, times: list[list[float]], default: float | None) -> float | None:
    """The start time of the first matched word: count the words before the first mark."""
    cut = highlighted.find(MARK_OPEN)
    if cut < 0 or not times:
        return default
    head = highlighted[:cut]
    before = len(head.split())
    if head and not head[-1].isspace():
        before -= 1  # the match is inside a word ("o'brien" is two tokens): that word is the one
    return float(times[min(before, len(times) - 1)][0])


def _covering_clip(conn: sqlite3.Connection, hit: Hit) -> dict[str, Any] | None:
    if hit.pts is None:
        return None
    row = conn.execute(
        "SELECT extra, pts, end_pts FROM entries WHERE stream = ? AND kind = 'clips' AND pts <= ? AND end_pts >= ? "
        "ORDER BY pts DESC LIMIT 1",
        (hit.stream_id, hit.pts, hit.pts),
    ).fetchone()
    if row is None:
        return None
    clip_id = json.loads(row[0])["clip_id"]
    return {"clip_id": clip_id, "offset_s": round(hit.pts - row[1], 3), "start_pts": row[1], "end_pts": row[2]}
