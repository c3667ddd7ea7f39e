"""The search syntax: what users type becomes quoted FTS5 strings, never FTS5 syntax."""

from __future__ import annotations

import sqlite3

import pytest

from realtime.timeline.query import MAX_QUERY_CHARS, MAX_TERMS, QueryError, parse


def test_words_phrases_or_and_exclusions() -> None:
    assert parse("red car").fts() == '"red" AND "car"'
    assert parse('"red car" parked').fts() == '"red car" AND "parked"'
    assert parse("red OR blue car").fts() == '("red" OR "blue") AND "car"'
    assert parse("car -red -\"at night\"").fts() == '("car") NOT ("red" OR "at night")'
    assert parse("deliv*").fts() == '"deliv"*'
    assert parse("Delivery").words == ["delivery"]


@pytest.mark.parametrize(
    "hostile",
    [
        'NEAR(a b, 1)',  # FTS5 functions
        "text:secret",  # column filters
        "^start",  # initial-token anchors
        "a AND OR NOT b",  # operators typed as words
        "{text}: x",
        "'; DROP TABLE entries; --",
        "x\x00y",
    ],
)
def test_fts_syntax_is_text_not_syntax(hostile: str) -> None:
    expression = parse(hostile).fts()
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='porter unicode61')")
    db.execute("INSERT INTO t VALUES ('a b near text secret start drop table entries')")
    db.execute("SELECT * FROM t WHERE t MATCH ?", (expression,)).fetchall()  # no syntax error


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "nothing to search for"),
        ("   ", "nothing to search for"),
        ("!!! ???", "nothing to search for"),
        ('"red car', "unclosed quote"),
        ("a*", "at least 3 characters"),
        ("ab*", "at least 3 characters"),
        ("*", "nothing to search for"),
        ('"red car"*', "single word"),
        ("-red", "only excluded"),
        ("x" * (MAX_QUERY_CHARS + 1), f"at most {MAX_QUERY_CHARS}"),
        (" ".join(f"w{i}" for i in range(MAX_TERMS + 1)), f"at most {MAX_TERMS}"),
    ],
)
def test_refusals_say_why(text: str, reason: str) -> None:
    with pytest.raises(QueryError, match=reason):
        parse(text)


def test_a_megabyte_query_is_refused_before_it_is_read() -> None:
    with pytest.raises(QueryError, match="characters"):
        parse("a " * 500_000)
