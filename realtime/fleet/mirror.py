"""A local copy of one key-value bucket, kept current by a watch.

Each entry remembers when this worker last saw it change (monotonic), so a record whose
expiry marker never arrived can still be judged stale. Writes this worker makes are put in
at once (`note`), so its own API answers read what it just wrote. The copy holds at most what
the bucket holds; deleted and expired keys leave it.

A watch can go quiet without an error: its ephemeral consumer lived on a NATS node that died
while this worker stayed connected to another. nats-py notices only after two missed 5 s
heartbeats, and retries no faster. So a worker that writes to the bucket says so (`expect`),
and a write its own watch has not delivered after a few seconds (`overdue`) means the watch is
stalled and is started again.

A watch's copy is complete only once the server's replay has arrived: nats-py's end-of-replay
marker can come ahead of it, so the mirror asks the server what it had sent and waits for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from pipelines.tasks import check_cancelled, until_set

log = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0
TOMBSTONE_KEEP_S = 60.0  # markers of gone keys are remembered this long (they expire sooner on the server)


@dataclass(frozen=True, slots=True)
class Seen:
    value: bytes
    revision: int
    seen_at: float  # the mirror's clock (time.monotonic) when this worker learnt of it


class KvMirror:
    def __init__(self, kv: KeyValue, *, on_change: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kv = kv
        self._clock = clock  # what seen_at and `overdue` read; tests drive a fake one
        self._entries: dict[str, Seen] = {}
        self._gone: dict[str, tuple[int, float]] = {}  # key -> (revision of its delete/expiry marker, seen at)
        self._on_change = on_change
        self.synced = asyncio.Event()  # set once the first full replay has arrived
        self._restart = asyncio.Event()
        self.failures = 0  # watches that ended with an error (monotonic)
        self.stalls = 0  # watches restarted because a write of this worker never came through
        self._delivered = 0  # highest revision a watch delivered
        self._expected: tuple[int, float] | None = None  # (revision, written at) not yet delivered

    def get(self, key: str) -> Seen | None:
        return self._entries.get(key)

    def items(self, prefix: str = "") -> list[tuple[str, Seen]]:
        return [(k, v) for k, v in self._entries.items() if k.startswith(prefix)]

    def tombstone(self, key: str) -> int | None:
        """Revision of the marker that removed `key`, if one was seen: a server-placed expiry
        marker is not a KV delete to nats-py's `create`, which then needs this revision."""
        gone = self._gone.get(key)
        return gone[0] if gone is not None else None

    def _bury(self, key: str, revision: int) -> None:
        now = self._clock()
        if len(self._gone) >= 2 * max(16, len(self._entries)):
            self._gone = {k: v for k, v in self._gone.items() if now - v[1] < TOMBSTONE_KEEP_S}
        self._gone[key] = (revision, now)

    def __len__(self) -> int:
        return len(self._entries)

    def note(self, key: str, value: bytes | None, revision: int) -> None:
        """Take in a change this worker made or read (None: the key is gone); older news is ignored."""
        current = self._entries.get(key)
        if current is not None and current.revision >= revision:
            return
        if value is None:
            self._entries.pop(key, None)
        else:
            self._entries[key] = Seen(value, revision, self._clock())
        if self._on_change is not None:
            self._on_change(key)

    def forget(self, key: str, revision: int) -> None:
        """Drop a key this worker knows is gone, unless something newer arrived meanwhile."""
        current = self._entries.get(key)
        if current is not None and current.revision <= revision:
            del self._entries[key]
            if self._on_change is not None:
                self._on_change(key)

    def expect(self, revision: int) -> None:
        """This worker wrote `revision`: its watch should deliver it soon."""
        if revision > self._delivered and self._expected is None:
            self._expected = (revision, self._clock())

    def overdue(self, after_s: float) -> bool:
        """A write expected more than `after_s` ago has not come through the watch."""
        expected = self._expected
        if expected is None:
            return False
        if self._delivered >= expected[0]:
            self._expected = None
            return False
        return self._clock() - expected[1] > after_s

    def restart(self, *, stalled: bool = False) -> None:
        """Watch again from the bucket's current state (after a reconnect the old watch may be gone)."""
        if stalled:
            self.stalls += 1
        self._expected = None  # the new watch gets its own time to deliver
        self._restart.set()

    async def run(self) -> None:
        while True:
            check_cancelled()  # nats-py's calls in a watch can swallow our cancel
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                log.warning("fleet watch failed; watching again", extra={"error": str(exc) or type(exc).__name__})
            await asyncio.sleep(RESTART_DELAY_S)

    async def _watch_once(self) -> None:
        self._restart.clear()
        watcher = await self._kv.watchall()
        fresh: dict[str, Seen] = {}
        replayed_up_to = 0  # the newest revision the replay showed: its copy of the bucket is this recent
        replaying = True
        replay_ends_at: int | None = None  # the revision the server had sent when nats-py said the replay ended

        def replayed() -> None:
            nonlocal replaying
            self._replace(fresh, replayed_up_to)
            replaying = False
            self.synced.set()

        try:
            while True:
                got, entry = await until_set(self._restart, watcher.updates(timeout=None), "kv-watch-update")
                if not got or self._restart.is_set():
                    return
                if entry is not None:
                    self._delivered = max(self._delivered, entry.revision)
                if entry is None:  # nats-py says the replay of what exists is complete
                    if replaying and replay_ends_at is None:
                        replay_ends_at = await _sent_so_far(watcher)
                        if replayed_up_to >= replay_ends_at:
                            replayed()
                    continue
                gone = entry.operation in (KV_DEL, KV_PURGE)
                if gone:
                    self._bury(entry.key, entry.revision)
                else:
                    self._gone.pop(entry.key, None)
                if replaying:
                    replayed_up_to = max(replayed_up_to, entry.revision)
                    if gone:
                        fresh.pop(entry.key, None)
                    else:
                        fresh[entry.key] = Seen(entry.value or b"", entry.revision, self._clock())
                    if replay_ends_at is not None and replayed_up_to >= replay_ends_at:
                        replayed()
                else:
                    self._take(entry.key, None if gone else (entry.value or b""), entry.revision)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    def _take(self, key: str, value: bytes | None, revision: int) -> None:
        current = self._entries.get(key)
        if current is not None and current.revision > revision:
            return
        if value is None:
            if key in self._entries:
                del self._entries[key]
        else:
            self._entries[key] = Seen(value, revision, self._clock())
        if self._on_change is not None:
            self._on_change(key)

    def _replace(self, fresh: dict[str, Seen], replayed_up_to: int) -> None:
        """Take a new watch's replay as the copy, except where this worker already knows better.

        The new watch's consumer may read a replica that is behind (just after a NATS node was
        lost): a key written after `replayed_up_to` is missing from its replay, and a key may come
        with an older revision than one noted here. Neither means the key went back or went away;
        the watch delivers the newer revision when its replica catches up."""
        merged = dict(fresh)
        for key, current in self._entries.items():
            replayed = fresh.get(key)
            newest_replayed = replayed_up_to if replayed is None else replayed.revision
            if current.revision > newest_replayed:
                merged[key] = current
        changed = set(merged) ^ set(self._entries)
        changed |= {k for k in merged if k in self._entries and merged[k].revision != self._entries[k].revision}
        self._entries = merged
        if self._on_change is not None:
            for key in changed:
                self._on_change(key)


async def _sent_so_far(watcher: KeyValue.KeyWatcher) -> int:
    """The newest revision the server has sent this watch. nats-py (to 2.16 at least, its issue
    #842) can put its end-of-replay marker ahead of replayed entries still on the wire: the
    replay ends only once the watch has delivered this revision."""
    subscription = getattr(watcher, "_sub", None)
    if subscription is None:  # a nats-py without it: its marker is all there is
        return 0
    delivered = (await subscription.consumer_info()).delivered
    if delivered is None or not delivered.consumer_seq:
        # Nothing sent (the bucket is empty, its entries expired): the server reports the
        # sequence before the consumer's start, the stream's last, as if it had been delivered.
        return 0
    return delivered.stream_seq or 0
