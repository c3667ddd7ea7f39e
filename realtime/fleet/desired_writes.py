"""What a worker writes to its fleet's desired set: the streams its API adds and removes, and the
config's streams when it joins.

Any worker's API may add or remove any fleet stream: it only writes the desired bucket, and the
worker that holds the stream's lease starts or stops it when its watch sees the change. A write is
noted in this worker's mirror at once, so its own API reads back what it just wrote. An id is added
with `create`, so two workers adding one id at the same moment cannot both succeed.
`fleet.max_streams` bounds the desired set as this worker sees it. A browser session is not a fleet
stream: it lives in the registry of the worker that negotiated it, and removing it is a local remove
there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import nats.js.errors

from realtime.config import AnyStreamSettings
from realtime.fleet.desired import DesiredStreams, encode_stream
from realtime.fleet.membership import NATS_ERRORS, FleetUnavailable, Membership
from realtime.fleet.mirror import KvMirror
from realtime.leases.buckets import FleetBuckets
from realtime.streams.registry import RegistryClosed, StreamExists, StreamLimitReached, StreamRegistry, UnknownStream

log = logging.getLogger("realtime.fleet.worker")  # the worker's log name: filters on it keep matching


class FleetLimitReached(StreamLimitReached):
    setting = "fleet.max_streams"

    def __init__(self, limit: int, wanted: int) -> None:
        super().__init__(limit, wanted, where=" in the fleet")


class DesiredWriter:
    def __init__(
        self,
        membership: Membership,
        desired: DesiredStreams,
        registry: StreamRegistry,
        *,
        max_streams: int,
        started: Callable[[], Collection[str]],
        closed: Callable[[], bool],
    ) -> None:
        self.membership = membership  # the buckets and their mirrors, once joined
        self.desired = desired
        self.registry = registry
        self.max_streams = max_streams
        self._started = started  # the fleet streams this worker put into its registry
        self._closed = closed  # draining: the API writes nothing more

    async def add(self, settings: AnyStreamSettings) -> None:
        mirror, buckets = self._open()
        if settings.id in self.desired.ids() or settings.id in self.registry:
            raise StreamExists(settings.id)
        if len(mirror) + 1 > self.max_streams:
            raise FleetLimitReached(self.max_streams, len(mirror) + 1)
        value = encode_stream(settings)
        try:
            revision = await buckets.desired.create(settings.id, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            raise StreamExists(settings.id) from None
        except NATS_ERRORS as exc:
            raise FleetUnavailable(str(exc) or type(exc).__name__) from None
        mirror.note(settings.id, value, revision)
        log.info("stream desired in the fleet", extra={"stream_id": settings.id, "revision": revision})

    async def remove(self, stream_id: str) -> None:
        mirror, buckets = self._open()
        seen = mirror.get(stream_id)
        if seen is None:
            if stream_id in self.registry and stream_id not in self._started():
                self.registry.remove(stream_id)  # a browser session: this worker's own
                return
            raise UnknownStream(stream_id)
        try:
            await buckets.desired.delete(stream_id)
        except NATS_ERRORS as exc:
            raise FleetUnavailable(str(exc) or type(exc).__name__) from None
        mirror.forget(stream_id, seen.revision)
        log.info("stream removed from the fleet", extra={"stream_id": stream_id})

    async def seed(self, settings: AnyStreamSettings) -> None:
        """A config stream, written unless the bucket holds the same settings (config wins for its ids)."""
        mirror, buckets = self.membership.desired_mirror, self.membership.buckets
        assert buckets is not None and mirror is not None
        if self.desired.settings(settings.id) == settings:
            return
        value = encode_stream(settings)
        revision = await buckets.desired.put(settings.id, value)
        mirror.note(settings.id, value, revision)

    def _open(self) -> tuple[KvMirror, FleetBuckets]:
        mirror, buckets = self.membership.desired_mirror, self.membership.buckets
        if self._closed() or mirror is None:
            raise RegistryClosed("the service is shutting down")
        assert buckets is not None
        return mirror, buckets
