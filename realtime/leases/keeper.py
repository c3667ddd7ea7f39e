"""The leases this worker holds: taken with `create`, renewed with compare-and-set on the
revision, handed back with a delete on the revision.

A lease is valid here until the moment its last renewal was *sent* plus the TTL less a margin.
The server counts the TTL from when it stored the renewal, which is later, so this worker's
view always ends first: once `valid()` is false no other worker can yet hold the stream, and
once another can, this one has stopped publishing. Monotonic time keeps running while a
process is stopped (SIGSTOP), so a worker that wakes after the TTL knows at once.

The fencing token is the revision at which the lease was taken (`token`): it stays the same
through renewals and is larger than any earlier owner's, so a consumer keeping the largest
token it has seen per stream can drop a stale owner's late events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from realtime.errors import ServiceError
from realtime.leases.records import LeaseRecord, lease_key

log = logging.getLogger("realtime.fleet.keeper")  # the keeper's log, under the name it always had


@dataclass(slots=True)
class Lease:
    stream_id: str
    token: int  # revision of the create: the fencing token events carry
    revision: int  # latest revision written by this worker
    valid_until: float  # time.monotonic()


@dataclass(slots=True)
class LeaseCounters:
    acquired: int = 0
    renewed: int = 0
    lost: int = 0  # taken away: another revision was written, or renewal failed past validity
    released: int = 0  # handed back on purpose
    contended: int = 0  # creates that found the lease held
    errors: int = 0  # requests that failed (timeouts, no connection)


class LeaseLost(ServiceError):
    pass


class LeaseKeeper:
    def __init__(
        self,
        kv: KeyValue,
        node: str,
        ttl_s: float,
        *,
        on_write: Callable[[str, bytes | None, int], None] | None = None,
        tombstone: Callable[[str], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kv = kv
        self.node = node
        self.ttl_s = ttl_s
        self.margin_s = max(0.2, ttl_s * 0.1)  # clock-rate differences and the server's expiry timer
        self._clock = clock
        self._on_write = on_write  # the local mirror learns of this worker's own writes at once
        self._tombstone = tombstone  # revision of the marker an expired lease left, from the mirror
        self._leases: dict[str, Lease] = {}
        self.counters = LeaseCounters()

    # -- what is held -------------------------------------------------------------------

    def held(self) -> list[str]:
        return list(self._leases)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._leases

    def __len__(self) -> int:
        return len(self._leases)

    def token(self, stream_id: str) -> int | None:
        """The fencing token while the lease is valid here, else None (do not publish)."""
        lease = self._leases.get(stream_id)
        if lease is None or self._clock() >= lease.valid_until:
            return None
        return lease.token

    def expired(self) -> list[str]:
        now = self._clock()
        return [sid for sid, lease in self._leases.items() if now >= lease.valid_until]

    # -- changes -------------------------------------------------------------------------

    async def acquire(self, stream_id: str) -> Lease | None:
        """Take an unowned stream's lease; None when another worker holds it."""
        sent = self._clock()
        value = LeaseRecord(self.node, stream_id).encode()
        try:
            revision = await self._create(lease_key(stream_id), value)
        except nats.js.errors.KeyWrongLastSequenceError:
            self.counters.contended += 1
            return None
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            self.counters.errors += 1
            log.debug("lease create failed", extra={"stream_id": stream_id, "error": str(exc)})
            return None
        lease = self._leases[stream_id] = Lease(stream_id, revision, revision, sent + self.ttl_s - self.margin_s)
        self.counters.acquired += 1
        self._wrote(stream_id, value, revision)
        log.info("lease acquired", extra={"stream_id": stream_id, "token": revision})
        return lease

    async def _create(self, key: str, value: bytes) -> int:
        try:
            return await self._kv.create(key, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            # An expired lease leaves the server's expiry marker (Nats-Marker-Reason: MaxAge) for a
            # second; `create` sees a value there. Writing on the marker's revision is just as atomic.
            marker = self._tombstone(key) if self._tombstone is not None else None
            if marker is None:
                raise
            return await self._kv.update(key, value, last=marker)

    async def renew(self, stream_id: str) -> bool:
        """Extend one lease. False when it is lost (and it is then dropped); a failed request
        keeps it until its validity runs out."""
        lease = self._leases.get(stream_id)
        if lease is None:
            return False
        sent = self._clock()
        value = LeaseRecord(self.node, stream_id).encode()
        try:
            try:
                revision = await self._kv.update(lease_key(stream_id), value, last=lease.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                if not await self._stored_late(stream_id, lease, value):
                    raise
                revision = await self._kv.update(lease_key(stream_id), value, last=lease.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            self._lose(stream_id, "another revision was written (expired, or another worker holds it)")
            return False
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            self.counters.errors += 1
            if self._clock() >= lease.valid_until:
                self._lose(stream_id, f"not renewed in time: {exc or type(exc).__name__}")
                return False
            return True
        if stream_id not in self._leases:  # dropped while the request was out
            return False
        if sent >= lease.valid_until:
            # Stored, but after this worker had already given it up as expired: hand it back.
            self._leases.pop(stream_id, None)
            self.counters.lost += 1
            await self._delete(stream_id, revision)
            return False
        lease.revision = revision
        lease.valid_until = sent + self.ttl_s - self.margin_s
        self.counters.renewed += 1
        self._wrote(stream_id, value, revision)
        return True

    async def _stored_late(self, stream_id: str, lease: Lease, value: bytes) -> bool:
        """Whether the newer revision is this worker's own renewal that timed out here but was
        stored (a slow leader election, say); then it becomes the lease's revision. Node names are
        unique in a fleet, so no other worker writes this value."""
        try:
            entry = await self._kv.get(lease_key(stream_id))
        except (nats.errors.Error, nats.js.errors.KeyNotFoundError, TimeoutError, OSError):
            return False
        revision = entry.revision or 0
        if entry.operation is not None or entry.value != value or revision <= lease.revision:
            return False
        lease.revision = revision
        return True

    def forfeit(self, stream_id: str, why: str) -> None:
        """Give a lease up without writing: the bucket already says someone else holds it."""
        self._lose(stream_id, why)

    def drop_expired(self) -> list[str]:
        """Give up, locally, every lease whose validity ran out; returns their ids."""
        gone = self.expired()
        for stream_id in gone:
            self._lose(stream_id, "validity ran out before a renewal succeeded")
        return gone

    async def release(self, stream_id: str) -> None:
        """Hand a lease back so another worker takes the stream at once."""
        lease = self._leases.pop(stream_id, None)
        if lease is None:
            return
        self.counters.released += 1
        log.info("lease released", extra={"stream_id": stream_id, "token": lease.token})
        await self._delete(stream_id, lease.revision)

    async def _delete(self, stream_id: str, revision: int) -> None:
        try:
            await self._kv.delete(lease_key(stream_id), last=revision)
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            # It expires by its TTL instead; only the handover is slower.
            log.info("lease release failed", extra={"stream_id": stream_id, "error": str(exc) or type(exc).__name__})

    def _lose(self, stream_id: str, why: str) -> None:
        lease = self._leases.pop(stream_id, None)
        if lease is None:
            return
        self.counters.lost += 1
        log.warning("lease lost; fencing the stream", extra={"stream_id": stream_id, "token": lease.token,
                                                             "reason": why})

    def _wrote(self, stream_id: str, value: bytes, revision: int) -> None:
        if self._on_write is not None:
            self._on_write(lease_key(stream_id), value, revision)
