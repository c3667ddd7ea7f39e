"""The timeline as the service runs it: the index file (a temporary one unless `timeline.path`
is set), its indexer, and searches run off the event loop a few at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

from nats.aio.client import Client as NatsClient
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from realtime.timeline.config import TimelineSettings
from realtime.timeline.index import Filters, Hit, TimelineIndex
from realtime.timeline.indexer import TimelineIndexer
from realtime.timeline.query import Query
from realtime.timeline.search import SearchRequest

log = logging.getLogger(__name__)

MAX_CONCURRENT_SEARCHES = 4  # each holds a thread; past this, requests wait their turn


class Timeline:
    def __init__(self, index: TimelineIndex, indexer: TimelineIndexer) -> None:
        self.index = index
        self.indexer = indexer
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_SEARCHES)

    async def search(self, request: SearchRequest) -> tuple[list[Hit], bool]:
        """QueryTooBroad when it cannot be ranked in the index's time limit."""
        async with self._slots:
            return await asyncio.to_thread(
                self.index.search, request.query, request.filters, limit=request.limit, offset=request.offset,
                order=request.order)

    async def retrieve(self, query: Query, filters: Filters, limit: int) -> list[Hit]:
        """The best `limit` entries for the query (what `ask` gives the VLM as evidence)."""
        async with self._slots:
            hits, _ = await asyncio.to_thread(self.index.search, query, filters, limit=limit, offset=0)
        return hits

    async def run(self) -> None:
        await self.indexer.run()


@contextlib.asynccontextmanager
async def open_timeline(
    settings: TimelineSettings, connection: Callable[[], NatsClient | None], *, node: str
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
            yield Timeline(index, TimelineIndexer(index, connection, node=node, batch=settings.batch))
        finally:
            index.close()
    finally:
        if scratch is not None:
            scratch.cleanup()


class TimelineCollector(Collector):
    """The index's size and what the indexer did, for /metrics."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline

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
        lag = sorted(indexer.lag_s)
        if lag:
            yield GaugeMetricFamily("vidsentry_timeline_lag_p50_seconds",
                                    "Published -> searchable, median of the recent events", value=lag[len(lag) // 2])
