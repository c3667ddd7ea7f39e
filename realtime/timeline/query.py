"""The search syntax users type, turned into an FTS5 expression that cannot be anything else.

    red car            both words (any order, stemmed: "cars" finds "car")
    "red car"          the phrase
    red OR blue        either
    -night             not this word (or -"a phrase"); at least one word must be wanted
    deliv*             words starting with deliv (3 characters or more before the star)

Nothing the user types reaches FTS5 as syntax: every word and phrase is sent as a quoted FTS5
string, so `NEAR(`, column filters, `^` and stray quotes are plain text or a 400 with the reason.
The bounds keep one query cheap: its length, its number of terms, and prefixes short enough to
expand into most of the vocabulary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from realtime.errors import ServiceError

MAX_QUERY_CHARS = 500
MAX_TERMS = 16
MIN_PREFIX_CHARS = 3
_WORD = re.compile(r"\w+", re.UNICODE)
_STOPWORD_TEXT = (
    "a an and any are as at be been but by can could did do does for from had has have how i if in into is it its "
    "me my no not of on or our please say said show tell than that the their them then there these they this "
    "those to up was we were what when where which while who whom why will with would you your ever anything "
    "anyone someone something happen happened"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_TOKEN = re.compile(r'\s*(-?)(?:"([^"]*)"|([^\s"]+))(\*?)')


class QueryError(ServiceError, ValueError):
    """The query cannot be searched; the message says why and what to type instead."""


@dataclass(frozen=True, slots=True)
class Term:
    words: tuple[str, ...]  # one word, or a phrase's words
    negated: bool = False
    prefix: bool = False

    def fts(self) -> str:
        return '"' + " ".join(self.words) + '"' + ("*" if self.prefix else "")


@dataclass(frozen=True, slots=True)
class Query:
    groups: tuple[tuple[Term, ...], ...]  # AND of ORs
    excluded: tuple[Term, ...]

    def fts(self) -> str:
        wanted = " AND ".join(
            group[0].fts() if len(group) == 1 else "(" + " OR ".join(t.fts() for t in group) + ")"
            for group in self.groups
        )
        if not self.excluded:
            return wanted
        return f"({wanted}) NOT (" + " OR ".join(t.fts() for t in self.excluded) + ")"

    @property
    def words(self) -> list[str]:
        return [w for group in self.groups for term in group for w in term.words]


def parse(text: str) -> Query:
    if len(text) > MAX_QUERY_CHARS:
        raise QueryError(f"the query is {len(text)} characters; at most {MAX_QUERY_CHARS}")
    if text.count('"') % 2:
        raise QueryError('an unclosed quote: close the phrase ("like this") or remove the quote')
    terms: list[Term | None] = []  # None marks an OR between two terms
    pos = 0
    stripped = text.strip()
    while pos < len(stripped):
        match = _TOKEN.match(stripped, pos)
        if match is None or match.end() == pos:
            break
        pos = match.end()
        minus, phrase, word, star = match.groups()
        if phrase is None and not minus and not star and word == "OR":
            terms.append(None)
            continue
        raw = phrase if phrase is not None else word
        if raw.endswith("*"):  # `deliv*` arrives as the word `deliv*` (the star is not a separate token)
            raw, star = raw.rstrip("*"), "*"
        words = tuple(w.lower() for w in _WORD.findall(raw))
        if not words:
            continue  # punctuation only: nothing to find
        if star and (phrase is not None and len(words) > 1):
            raise QueryError("a * ends a single word (deliv*), not a phrase")
        if star and len(words[-1]) < MIN_PREFIX_CHARS:
            raise QueryError(f"a prefix needs at least {MIN_PREFIX_CHARS} characters before the *: {raw}*")
        if star and len(words) > 1:  # `o'brie*`: the parts are a phrase ending in a prefix
            raise QueryError(f"a * ends a plain word: {raw}*")
        terms.append(Term(words, negated=bool(minus), prefix=bool(star)))
    real = [t for t in terms if t is not None]
    if not real:
        raise QueryError("nothing to search for: type one or more words")
    if len(real) > MAX_TERMS:
        raise QueryError(f"{len(real)} terms; at most {MAX_TERMS}")
    groups: list[list[Term]] = []
    excluded: list[Term] = []
    joined = False
    for term in terms:
        if term is None:
            joined = bool(groups)  # a leading OR joins nothing
            continue
        if term.negated:
            excluded.append(term)
            joined = False
        elif joined:
            groups[-1].append(term)
            joined = False
        else:
            groups.append([term])
    if not groups:
        raise QueryError("only excluded words: say what to find as well (car -red)")
    return Query(tuple(tuple(g) for g in groups), tuple(excluded))


def retrieval_query(question: str) -> Query:
    """The question's content words, any of them (BM25 ranks entries with more, and rarer, first)."""
    words = list(dict.fromkeys(w for w in re.findall(r"\w+", question.lower()) if w not in _STOPWORDS and len(w) > 2))
    if not words:
        raise QueryError("the question has no words to look for (ask about what was said or seen)")
    return Query((tuple(Term((w,)) for w in words[:MAX_TERMS]),), ())
