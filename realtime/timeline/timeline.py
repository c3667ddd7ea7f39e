"""The timeline as the service runs it: the index file (a temporary one unless `timeline.path`
is set), its indexer, and searches run off the event loop a few at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NatsClient
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from realtime.config import TimelineSettings
from realtime.leases.options import FleetOptions
from realtime.timeline.ask import Asker
from realtime.timeline.index import MAX_LIMIT, MAX_OFFSET, Filters, Hit, TimelineIndex
from realtime.timeline.indexer import TimelineIndexer
from realtime.timeline.query import Query, retrieval_query
from realtime.timeline.role import (
    IndexerRole,
    filters_to_json,
    forward,
    hit_from_json,
    hit_to_json,
    parse_remote,
)
from realtime.timeline.search import ORDERS, SearchRequest

log = logging.getLogger(__name__)

MAX_CONCURRENT_SEARCHES = 4  # each holds a thread; past this, requests wait their turn


class Timeline:
    """Searches answered here, or (in a fleet, on a worker not holding the index) forwarded to
    the worker that does (realtime.timeline.role)."""

    def __init__(self, index: TimelineIndex, indexer: TimelineIndexer, *, fleet: FleetOptions | None = None,
                 connection: Callable[[], NatsClient | None] | None = None) -> None:
        self.index = index
        self.indexer = indexer
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_SEARCHES)
        self._connection = connection or (lambda: None)
        self.fleet = fleet
        self.role = IndexerRole(indexer.run, self._answer_remote, self._connection, fleet) if fleet else None

    @property
    def local(self) -> bool:
        """This worker's index answers (no fleet, or this worker holds the fleet's index)."""
        return self.role is None or self.role.held

    def info(self) -> dict[str, Any]:
        return {"entries": self.index.stats.entries, "caught_up": self.indexer.stats.caught_up,
                "node": self.fleet.node if self.fleet else None}

    async def search(self, request: SearchRequest) -> tuple[list[Hit], bool, dict[str, Any]]:
        """Hits, whether more follow, and which index answered. QueryTooBroad when it cannot be
        ranked in the time limit; IndexUnavailable or RemoteRefusal from a forwarded search."""
        if not self.local:
            assert self.fleet is not None
            reply = await forward(self._connection(), self.fleet.name, {
                "op": "search", "q": request.text, "filters": filters_to_json(request.filters),
                "limit": request.limit, "offset": request.offset, "order": request.order})
            return [hit_from_json(h) for h in reply["hits"]], bool(reply["more"]), dict(reply.get("index") or {})
        hits, more = await self._local(request.query, request.filters, request.limit, request.offset, request.order)
        return hits, more, self.info()

    async def retrieve(self, question: str, filters: Filters, limit: int) -> list[Hit]:
        """The best `limit` entries for a question (what `ask` gives the VLM as evidence)."""
        if not self.local:
            assert self.fleet is not None
            reply = await forward(self._connection(), self.fleet.name, {
                "op": "retrieve", "question": question, "filters": filters_to_json(filters), "limit": limit})
            return [hit_from_json(h) for h in reply["hits"]]
        hits, _ = await self._local(retrieval_query(question), filters, limit, 0, "relevance")
        return hits

    async def _local(self, query: Query, filters: Filters, limit: int, offset: int,
                     order: str) -> tuple[list[Hit], bool]:
        async with self._slots:
            return await asyncio.to_thread(self.index.search, query, filters, limit=limit, offset=offset, order=order)

    async def _answer_remote(self, request: dict[str, Any]) -> dict[str, Any]:
        op, query, filters = parse_remote(request)
        limit = min(max(int(request.get("limit", 20)), 1), MAX_LIMIT)
        offset = min(max(int(request.get("offset", 0)), 0), MAX_OFFSET)
        order = request.get("order") if request.get("order") in ORDERS else "relevance"
        hits, more = await self._local(query, filters, limit, offset if op == "search" else 0, str(order))
        return {"hits": [hit_to_json(h) for h in hits], "more": more, "index": self.info()}

    async def run(self) -> None:
        if self.role is not None:
            await self.role.run()  # indexes only while this worker holds the fleet's index
        else:
            await self.indexer.run()


@contextlib.asynccontextmanager
async def open_timeline(
    settings: TimelineSettings, connection: Callable[[], NatsClient | None], *, node: str,
    fleet: FleetOptions | None = None,
) -> AsyncIterator[Timeline | None]:
    """The timeline the settings ask for, or None when it is off. TimelineIndexError for a file
    that cannot be used."""
    if not settings.enabled:
        yield None
        return
    scratch: tempfile.TemporaryDirectory[str] | None = None
    if settings.path is None:
        scratch = tempfile.TemporaryDirectory(prefix="vidsentry-timeline-")
        path = Path(scratch.name) / "timeline.db"
    else:
        path = settings.path.expanduser()
    try:
        index = await asyncio.to_thread(
            TimelineIndex, path, max_entries=settings.max_entries, max_age_s=settings.max_age_s)
        try:
            log.info("timeline index open", extra={
                "path": str(path) if scratch is None else "(temporary)", "entries": index.stats.entries,
                "position": index.position, "search": "BM25 (SQLite FTS5)"})
            # In a fleet one consumer serves whichever worker holds the index; it is made again
            # from that worker's own position when the index moves.
            indexer = TimelineIndexer(index, connection, node=f"fleet-{fleet.name}" if fleet else node,
                                      batch=settings.batch)
            yield Timeline(index, indexer, fleet=fleet, connection=connection)
        finally:
            index.close()
    finally:
        if scratch is not None:
            scratch.cleanup()


class TimelineCollector(Collector):
    """The index's size, what the indexer did and what asking did, for /metrics."""

    def __init__(self, timeline: Timeline, asker: Asker | None = None) -> None:
        self.timeline = timeline
        self.asker = asker

    def collect(self) -> Iterable[Metric]:
        index, indexer = self.timeline.index.stats, self.timeline.indexer.stats
        yield GaugeMetricFamily("vidsentry_timeline_entries", "Entries in the search index", value=index.entries)
        yield GaugeMetricFamily("vidsentry_timeline_pending", "Events JetStream holds that are not indexed yet",
                                value=indexer.pending)
        for name, help_, value in (
            ("indexed", "Entries added to the search index", index.indexed),
            ("duplicates", "Events read again that the index already kept", index.duplicates),
            ("pruned", "Entries deleted for age or count (timeline.max_age_s, max_entries)", index.pruned),
            ("skipped", "Events read but not kept (track updates, unreadable bodies)", indexer.skipped),
            ("rebuilds", "Times the consumer was made again from the index's position", indexer.rebuilds),
            ("failures", "Batches that failed to commit (read again)", indexer.failures),
            ("queries", "Searches answered", index.queries),
            ("refused", "Searches refused (syntax, too broad)", index.refused),
        ):
            yield CounterMetricFamily(f"vidsentry_timeline_{name}", help_, value=value)
        if self.asker is not None:
            asked = self.asker.stats
            for name, help_, value in (
                ("asks", "Questions asked", asked.asked),
                ("ask_failures", "Questions the VLM could not answer", asked.failed),
                ("ask_citations_dropped", "Citations dropped: unconfirmed by the check, or citing nothing",
                 asked.citations_dropped),
                ("asks_refused", "Questions refused while others were being answered", asked.refused),
            ):
                yield CounterMetricFamily(f"vidsentry_timeline_{name}", help_, value=value)
        lag = sorted(indexer.lag_s)
        if lag:
            yield GaugeMetricFamily("vidsentry_timeline_lag_p50_seconds",
                                    "Published -> searchable, median of the recent events", value=lag[len(lag) // 2])
