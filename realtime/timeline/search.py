"""A search request, read and answered the same way for `GET /api/search` and `vidsentry search`.

    q       the query (realtime.timeline.query's syntax)
    stream  stream ids, comma-separated (or repeated)
    kind    captions, descriptions, alerts, tracks, clips (comma-separated)
    since   epoch seconds, RFC 3339, or an age (`90s`, `15m`, `2h`, `7d`) meaning that long ago
    until   the same
    order   relevance (BM25, default) or newest
    limit   1..100 (default 20);  offset 0..10,000 (the `next` link carries it)

Every refusal is a `SearchRequestError` whose message says what to send instead.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from pipelines.frames import STREAM_ID_PATTERN
from realtime.errors import ServiceError
from realtime.timeline.entries import indexed_kinds
from realtime.timeline.index import MAX_LIMIT, MAX_OFFSET, Filters, Hit
from realtime.timeline.query import Query, QueryError, parse

DEFAULT_LIMIT = 20
MAX_STREAMS = 64
_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
ORDERS = ("relevance", "newest")


class SearchRequestError(ServiceError, ValueError):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class SearchRequest:
    text: str
    query: Query
    filters: Filters
    limit: int
    offset: int
    order: str

    def params(self, offset: int) -> dict[str, str]:
        out = {"q": self.text, "limit": str(self.limit), "offset": str(offset), "order": self.order}
        if self.filters.streams:
            out["stream"] = ",".join(self.filters.streams)
        if self.filters.kinds:
            out["kind"] = ",".join(self.filters.kinds)
        if self.filters.since is not None:
            out["since"] = f"{self.filters.since:.3f}"
        if self.filters.until is not None:
            out["until"] = f"{self.filters.until:.3f}"
        return out


def read_request(get: Callable[[str], Sequence[str]], *, now: float | None = None) -> SearchRequest:
    """From query parameters (`get(name)` gives every value of one)."""
    texts = get("q")
    if not texts or not texts[0].strip():
        raise SearchRequestError("q: say what to search for (q=red+car)", "q")
    try:
        query = parse(texts[0])
    except QueryError as exc:
        raise SearchRequestError(f"q: {exc}", "q") from None
    streams = _listed(get("stream"))
    check_streams(streams)
    kinds = _listed(get("kind"))
    known = [k.value for k in indexed_kinds()]
    for kind in kinds:
        if kind not in known:
            raise SearchRequestError(f"kind: {kind[:30]!r} is not one of {', '.join(known)}", "kind")
    at = time.time() if now is None else now
    since, until = (parse_time(get(name), name, at) for name in ("since", "until"))
    if since is not None and until is not None and since > until:
        raise SearchRequestError("since is after until", "since")
    order = (get("order") or ["relevance"])[0]
    if order not in ORDERS:
        raise SearchRequestError(f"order: relevance or newest, not {order[:30]!r}", "order")
    limit = _integer(get("limit"), "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    offset = _integer(get("offset"), "offset", 0, 0, MAX_OFFSET)
    return SearchRequest(texts[0], query, Filters(tuple(streams), tuple(kinds), since, until), limit, offset, order)


def check_streams(streams: Sequence[str]) -> None:
    if len(streams) > MAX_STREAMS:
        raise SearchRequestError(f"stream: at most {MAX_STREAMS} streams", "stream")
    for stream in streams:
        if not isinstance(stream, str) or not STREAM_ID_PATTERN.fullmatch(stream):
            raise SearchRequestError(f"stream: {str(stream)[:70]!r} is not a stream id", "stream")


def _listed(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(part.strip() for value in values for part in value.split(",") if part.strip()))


def _integer(values: Sequence[str], name: str, default: int, low: int, high: int) -> int:
    if not values:
        return default
    try:
        value = int(values[0])
    except ValueError:
        raise SearchRequestError(f"{name}: a whole number from {low} to {high}", name) from None
    if not low <= value <= high:
        raise SearchRequestError(f"{name}: a whole number from {low} to {high}", name)
    return value


def parse_time(values: Sequence[str], name: str, now: float) -> float | None:
    if not values or not values[0].strip():
        return None
    raw = values[0].strip()
    age = _AGE.fullmatch(raw)
    if age:
        return now - float(age.group(1)) * _UNIT_S[age.group(2)]
    try:
        value = float(raw)
    except ValueError:
        try:
            moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            raise SearchRequestError(
                f"{name}: epoch seconds, RFC 3339 (2026-11-27T10:00:00Z) or an age (15m, 2h, 7d)", name) from None
        if moment.tzinfo is None:
            raise SearchRequestError(f"{name}: give a time zone (Z or +01:00)", name) from None
        value = moment.timestamp()
    if not math.isfinite(value):
        raise SearchRequestError(f"{name}: a finite time", name)
    return value


def hit_view(hit: Hit, *, live: Callable[[str], bool],
             buffered: Callable[[str, float], bool] = lambda stream_id, t: False) -> dict[str, Any]:
    """One hit as the API shows it, with links to the moment: the clip that covers it (seeked to
    the hit's time); the picture at that time while the stream's buffer still holds it (else its
    newest frame while it runs); its recent captions."""
    links: dict[str, str] = {}
    if hit.clip is not None:
        clip_id, offset = hit.clip["clip_id"], hit.clip["offset_s"]
        links.update(clip=f"/api/clips/{clip_id}", mp4=f"/api/clips/{clip_id}.mp4#t={offset:g}",
                     vtt=f"/api/clips/{clip_id}.vtt")
    elif hit.kind == "clips" and "clip_id" in hit.extra:
        clip_id = hit.extra["clip_id"]
        links.update(clip=f"/api/clips/{clip_id}", mp4=f"/api/clips/{clip_id}.mp4")
    if hit.pts is not None and buffered(hit.stream_id, hit.pts):
        links["frame"] = f"/api/streams/{hit.stream_id}/frame.jpg?pts={hit.pts:.3f}"
    if live(hit.stream_id):
        links.setdefault("frame", f"/api/streams/{hit.stream_id}/frame.jpg")
        if hit.kind == "captions":
            links["captions"] = f"/api/streams/{hit.stream_id}/captions.vtt"
    view: dict[str, Any] = {
        "event_id": hit.event_id,
        "stream_id": hit.stream_id,
        "kind": hit.kind,
        "pts": None if hit.pts is None else round(hit.pts, 3),
        "end_pts": None if hit.end_pts is None else round(hit.end_pts, 3),
        "time": datetime.fromtimestamp(hit.wall).astimezone().isoformat(timespec="milliseconds"),
        "wall": round(hit.wall, 3),
        "snippet": hit.snippet,
        "marks": [list(m) for m in hit.marks],
        "score": round(hit.score, 4),
        "links": links,
    }
    if hit.clip is not None:
        view["clip"] = hit.clip
    view.update({k: v for k, v in hit.extra.items() if k in ("alert_id", "rule_id", "track_id", "clip_id")})
    return view


def answer(request: SearchRequest, hits: list[Hit], more: bool, *, live: Callable[[str], bool],
           buffered: Callable[[str, float], bool] = lambda stream_id, t: False,
           base: str = "/api/search") -> dict[str, Any]:
    body: dict[str, Any] = {
        "query": request.text,
        "hits": [hit_view(h, live=live, buffered=buffered) for h in hits],
        "offset": request.offset,
        "limit": request.limit,
        "next": None,
    }
    if more and request.offset + request.limit <= MAX_OFFSET:
        body["next"] = f"{base}?{urlencode(request.params(request.offset + request.limit))}"
    return body


def marked(snippet: str, marks: Sequence[Sequence[int]], open_: str, close: str) -> str:
    """The snippet with its matches wrapped, for a terminal."""
    out, last = [], 0
    for start, end in marks:
        out += [snippet[last:start], open_, snippet[start:end], close]
        last = end
    out.append(snippet[last:])
    return "".join(out)


def query_getter(params: Mapping[str, Any]) -> Callable[[str], Sequence[str]]:
    """`get` over a multidict (aiohttp's) or a plain dict of lists."""
    getall = getattr(params, "getall", None)
    if getall is not None:
        return lambda name: list(getall(name, []))
    return lambda name: list(params.get(name) or [])
