"""The indexer against a real nats-server: events published by the real publisher become
searchable; a deleted index is rebuilt from JetStream; a crash between commit and ack, and a
stream made again, neither lose nor double an entry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from pipelines.event_bodies import track_event
from pipelines.events import Event
from pipelines.tracker import LifecycleKind, TrackEvent
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import STREAM_NAME
from realtime.bus.publisher import NatsEventPublisher
from realtime.timeline.index import Filters, TimelineIndex
from realtime.timeline.indexer import TimelineIndexer
from realtime.timeline.query import parse
from tests.realtime.timeline.bodies import caption, description
from tests.support.nats import fetches_time_out_between_pulls
from tests.support.waiting import wait_until

NOW = time.time()


def track(stream: str, track_id: int, kind: LifecycleKind) -> Event:
    change = TrackEvent(kind=kind, track_id=track_id, class_id=0, score=0.9, box=(1.0, 2.0, 3.0, 4.0),
                        first_seen_pts=1.0, last_seen_pts=9.0, hits=20)
    return track_event(stream, change, {0: "person"}, pts=9.0, captured_at=NOW)


def events(round_: int) -> list[Event]:
    out: list[Event] = []
    for i in range(20):
        stream = f"cam{i % 2}"
        out.append(caption(stream, f"r{round_}s{i}", f"round {round_} sentence number{i} about the loading dock",
                           float(i * 5), at=NOW + i))
        out.append(track(stream, round_ * 100 + i, LifecycleKind.UPDATE))  # read, not kept
    out.append(description("cam0", f"round {round_}: a forklift crosses the loading dock", 0.0, 10.0, at=NOW))
    out.append(track("cam1", round_ * 100 + 99, LifecycleKind.END))
    return out


KEPT_PER_ROUND = 22  # 20 captions, 1 description, 1 ended track


@contextlib.asynccontextmanager
async def indexing(index: TimelineIndex, publisher: NatsEventPublisher) -> AsyncIterator[TimelineIndexer]:
    indexer = TimelineIndexer(index, lambda: publisher.nc, node="test", batch=16, fetch_timeout_s=0.2)
    task = asyncio.create_task(indexer.run())
    try:
        yield indexer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def publish(publisher: NatsEventPublisher, batch: list[Event]) -> None:
    for event in batch:
        await publisher.publish(event)
    assert await publisher.flush(10)


def count(index: TimelineIndex, text: str) -> int:
    hits, _ = index.search(parse(text), Filters(), limit=100, offset=0)
    return len(hits)


async def test_published_events_become_searchable_and_a_lost_index_is_rebuilt(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    async with NatsEventPublisher(nats_server.url, node="test") as publisher:
        await publish(publisher, events(1))
        index = TimelineIndex(tmp_path / "a.db", max_entries=100_000, max_age_s=10 * 86400)
        async with indexing(index, publisher) as indexer:
            await wait_until(lambda: index.stats.entries == KEPT_PER_ROUND, 10, "the first round indexed")
            await publish(publisher, events(2))  # while it runs: picked up as they land
            await wait_until(lambda: index.stats.entries == 2 * KEPT_PER_ROUND, 10, "the second round indexed")
            assert indexer.stats.skipped == 40 and index.stats.duplicates == 0
            # A lag for each event indexed; how long it is, bench/bench_timeline.py measures.
            assert len(indexer.stats.lag_s) == 2 * KEPT_PER_ROUND and min(indexer.stats.lag_s) >= 0
        assert count(index, "forklift") == 2 and count(index, '"number7 about"') == 2
        hits, _ = index.search(parse("person track"), Filters(kinds=("tracks",)), limit=10, offset=0)
        assert len(hits) == 2 and {h.pts for h in hits} == {1.0}
        index.close()

        (tmp_path / "a.db").unlink()  # the file is lost: the next start reads JetStream from the start
        for suffix in ("-wal", "-shm"):
            (tmp_path / f"a.db{suffix}").unlink(missing_ok=True)
        rebuilt = TimelineIndex(tmp_path / "a.db", max_entries=100_000, max_age_s=10 * 86400)
        async with indexing(rebuilt, publisher) as indexer:
            await wait_until(lambda: rebuilt.stats.entries == 2 * KEPT_PER_ROUND and indexer.stats.caught_up, 10,
                             "the index rebuilt")
            assert indexer.stats.rebuilds == 1
        assert count(rebuilt, "forklift") == 2 and rebuilt.stats.duplicates == 0


async def test_a_crash_between_commit_and_ack_loses_and_doubles_nothing(
    nats_server: EmbeddedNatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[int] = []
    real_ack = Msg.ack

    async def ack_fails_once(self: Msg) -> None:
        if not failed:
            failed.append(1)
            raise OSError("connection lost before the ack")  # committed, never acked
        await real_ack(self)

    monkeypatch.setattr(Msg, "ack", ack_fails_once)
    async with NatsEventPublisher(nats_server.url, node="test") as publisher:
        await publish(publisher, events(1))
        index = TimelineIndex(tmp_path / "b.db", max_entries=100_000, max_age_s=10 * 86400)
        async with indexing(index, publisher) as indexer:
            await wait_until(lambda: index.stats.entries == KEPT_PER_ROUND and indexer.stats.caught_up, 15,
                             "indexing after the failed ack")
            await publish(publisher, events(2))
            await wait_until(lambda: index.stats.entries == 2 * KEPT_PER_ROUND, 10, "the second round")
        assert failed and indexer.stats.rebuilds == 1
        assert index.stats.duplicates == 0  # the consumer started again after the committed batch


async def test_a_stream_made_again_is_indexed_from_its_start(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    async with NatsEventPublisher(nats_server.url, node="test") as publisher:
        await publish(publisher, events(1))
        index = TimelineIndex(tmp_path / "c.db", max_entries=100_000, max_age_s=10 * 86400)
        async with indexing(index, publisher):
            await wait_until(lambda: index.stats.entries == KEPT_PER_ROUND, 10, "the first round")
        assert publisher.nc is not None
        await publisher.nc.jetstream().delete_stream(STREAM_NAME)
        await publisher.ensure_stream()
        await publish(publisher, events(2)[:3])  # fewer messages than the index's position
        async with indexing(index, publisher) as indexer:
            await wait_until(lambda: index.stats.entries == KEPT_PER_ROUND + 2 and indexer.stats.caught_up, 10,
                             "the new stream indexed")
        assert count(index, "forklift") == 1 and index.position <= 3


async def test_an_indexer_stopped_and_run_again_goes_on_where_it_was(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    """A fleet worker that loses the index and later holds it again runs the same indexer twice."""
    async with NatsEventPublisher(nats_server.url, node="test") as publisher:
        index = TimelineIndex(tmp_path / "d.db", max_entries=100_000, max_age_s=10 * 86400)
        indexer = TimelineIndexer(index, lambda: publisher.nc, node="test", batch=16, fetch_timeout_s=0.2)
        for round_ in (1, 2):
            await publish(publisher, events(round_))
            task = asyncio.create_task(indexer.run())
            await wait_until(lambda r=round_: index.stats.entries == r * KEPT_PER_ROUND, 10, f"round {round_}")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert index.stats.duplicates == 0 and indexer.stats.failures == 0


async def test_a_fetch_that_times_out_with_asyncio_s_error_is_an_empty_fetch_not_a_pause(
    nats_server: EmbeddedNatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """nats-py's fetch raises asyncio's TimeoutError, not its own, when its deadline passes between
    its no-wait pull and its waiting one (a loaded machine): that is "nothing new" too."""
    timed_out = fetches_time_out_between_pulls(monkeypatch, 3)
    caplog.set_level(logging.WARNING, logger="realtime.timeline.indexer")
    async with NatsEventPublisher(nats_server.url, node="test") as publisher:
        await publish(publisher, events(1))
        index = TimelineIndex(tmp_path / "e.db", max_entries=100_000, max_age_s=10 * 86400)
        async with indexing(index, publisher) as indexer:
            await wait_until(lambda: index.stats.entries == KEPT_PER_ROUND, 10, "the round after three timeouts")
        assert len(timed_out) == 3 and indexer.stats.failures == 0
        assert not [r for r in caplog.records if "paused" in r.getMessage()]
