"""The indexer: a durable JetStream pull consumer that feeds the timeline index.

It reads the durable kinds the index keeps (`vidsentry.*.<kind>` for each) from the VIDSENTRY
stream, in batches, and acks a batch (ack-all, one ack per batch) only after the index has
committed it. The index file, not the consumer, is the record of how far indexing got: at start
the consumer is checked against it and made again from the index's position when they disagree
(the file was deleted, or the process stopped between commit and ack). A stream made again
(its creation time differs from the one the index counted in) starts the index's position at 0;
the entries already kept stay, and their event ids make the replay add nothing twice.

NATS down, the stream missing, a batch that fails to commit: logged once per cause, retried after
a back-off; the service goes on. Consumers of nodes that are gone expire on the server after
`INACTIVE_THRESHOLD_S` of no fetches.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from pipelines.tasks import check_cancelled
from realtime.bus.cloudevents import SUBJECT_PREFIX, decode
from realtime.bus.jetstream import STREAM_NAME
from realtime.timeline.entries import Entry, NotIndexed, consumed_kinds, entry_of
from realtime.timeline.index import TimelineIndex

log = logging.getLogger(__name__)

INACTIVE_THRESHOLD_S = 24 * 3600.0
RETRY_S = (0.5, 1.0, 2.0, 5.0)
LAG_SAMPLES = 1024


def filter_subjects() -> list[str]:
    """The subjects of the kinds the timeline reads, as the capabilities declare them now."""
    return [f"{SUBJECT_PREFIX}.*.{kind.value}" for kind in consumed_kinds()]


def consumer_name(node: str) -> str:
    """One consumer per node: a node's index is its own file."""
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in node)[:64]
    return f"vidsentry-timeline-{safe}"


@dataclass(slots=True)
class IndexerStats:
    batches: int = 0
    read: int = 0  # messages read from JetStream
    skipped: int = 0  # read but not kept (track updates, unreadable bodies)
    rebuilds: int = 0  # the consumer made again from the index's position
    failures: int = 0
    pending: int = 0  # what JetStream still holds for the consumer
    caught_up: bool = False
    lag_s: deque[float] = field(default_factory=lambda: deque(maxlen=LAG_SAMPLES))  # published -> committed


class TimelineIndexer:
    def __init__(
        self,
        index: TimelineIndex,
        connection: Callable[[], NatsClient | None],
        *,
        node: str,
        batch: int = 256,
        fetch_timeout_s: float = 1.0,
    ) -> None:
        self.index = index
        self.durable = consumer_name(node)
        self.batch = batch
        self.stats = IndexerStats()
        self._connection = connection
        self._fetch_timeout_s = fetch_timeout_s
        self._last_problem: str | None = None

    async def run(self) -> None:
        """Index until cancelled. May run again afterwards (a fleet worker that loses the index
        and later holds it again): each run has its own writer thread."""
        # One thread writes the file: commits stay in order and never block the event loop.
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="timeline-writer")
        attempt = 0
        try:
            while True:
                nc = self._connection()
                if nc is None or not nc.is_connected:
                    await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                    attempt += 1
                    continue
                batches = self.stats.batches
                try:
                    await self._consume(nc)
                except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
                    self._problem(f"JetStream: {exc.__class__.__name__}: {exc}")
                except Exception as exc:  # a commit that failed: the batch is read again
                    self.stats.failures += 1
                    self._problem(f"indexing failed: {exc.__class__.__name__}: {exc}")
                self.stats.caught_up = False
                if self.stats.batches > batches:
                    attempt = 0  # it worked for a while: the back-off starts over
                # nats-py turns a cancelled wait on a closing connection into ConnectionClosedError.
                check_cancelled()
                await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                attempt += 1
        finally:
            self._writer.shutdown(wait=True)

    def _problem(self, why: str) -> None:
        if why != self._last_problem:
            log.warning("timeline indexer paused; retrying", extra={"reason": why})
            self._last_problem = why

    async def _consume(self, nc: NatsClient) -> None:
        js = nc.jetstream()
        await self._reconcile(js)
        sub = await js.pull_subscribe_bind(durable=self.durable, stream=STREAM_NAME)
        try:
            if self._last_problem is not None:
                log.info("timeline indexer resumed", extra={"position": self.index.position})
                self._last_problem = None
            while True:
                check_cancelled()  # a fetch's inner wait_for can swallow our cancel
                try:
                    msgs = await sub.fetch(self.batch, timeout=self._fetch_timeout_s)
                except TimeoutError:  # nats-py raises its own or, between its two pulls, asyncio's
                    self.stats.caught_up = True
                    self.stats.pending = 0
                    continue
                await self._take(msgs)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _reconcile(self, js: nats.js.JetStreamContext) -> None:
        info = await js.stream_info(STREAM_NAME)
        source = str(info.created or "")
        position = self.index.position
        if self.index.source != source or position > (info.state.last_seq or 0):
            if self.index.source is not None:
                log.info("JetStream stream %s was made again: indexing it from the start", STREAM_NAME)
            await asyncio.get_running_loop().run_in_executor(self._writer, self.index.restart_from_zero, source)
            position = 0
        try:
            consumer = await js.consumer_info(STREAM_NAME, self.durable)
            floor = consumer.ack_floor.stream_seq if consumer.ack_floor is not None else 0
            delivered = consumer.delivered.stream_seq if consumer.delivered is not None else 0
            # Its ack floor is where the index stands, and nothing past it is out unacked: use it as it
            # is, unless it reads other subjects (a version that indexed other kinds made it).
            same_subjects = sorted(consumer.config.filter_subjects or []) == sorted(filter_subjects())
            if floor == position and delivered <= position and same_subjects:
                return
            await js.delete_consumer(STREAM_NAME, self.durable)
            self.stats.rebuilds += 1
            log.info("timeline consumer made again from the index's position",
                     extra={"position": position, "ack_floor": floor})
        except nats.js.errors.NotFoundError:
            pass
        await js.add_consumer(STREAM_NAME, ConsumerConfig(
            durable_name=self.durable,
            filter_subjects=filter_subjects(),
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if position else DeliverPolicy.ALL,
            opt_start_seq=position + 1 if position else None,
            ack_policy=AckPolicy.ALL,
            ack_wait=30.0,
            max_ack_pending=self.batch * 4,
            inactive_threshold=INACTIVE_THRESHOLD_S,
            description="vidsentry timeline index (search)",
        ))

    async def _take(self, msgs: list[Msg]) -> None:
        entries: list[tuple[int, Entry]] = []
        published: list[float] = []
        last = 0
        for msg in msgs:
            meta = msg.metadata
            last = max(last, meta.sequence.stream)
            self.stats.read += 1
            kind = msg.subject.rsplit(".", 1)[-1]
            decoded = decode(msg.headers, msg.data)
            body, event_id = decoded["data"], decoded["headers"].get("ce-id")
            if not isinstance(body, dict) or not event_id:
                self.stats.skipped += 1
                continue
            try:
                entries.append((meta.sequence.stream, entry_of(event_id, kind, body)))
            except NotIndexed:
                self.stats.skipped += 1
                continue
            published.append(meta.timestamp.timestamp() if meta.timestamp is not None else time.time())
        self.stats.pending = msgs[-1].metadata.num_pending if msgs else 0
        await asyncio.get_running_loop().run_in_executor(self._writer, self.index.add, entries, last)
        if msgs:
            await msgs[-1].ack()  # ack-all: the whole batch
        now = time.time()
        self.stats.lag_s.extend(now - at for at in published)
        self.stats.batches += 1
        self.stats.caught_up = self.stats.pending == 0
