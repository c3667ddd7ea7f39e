"""The local registry kept to the leases: a fleet worker runs exactly the fleet streams whose leases
it holds, with the settings the desired set has for them now.

The registry stays the only place runs start and stop; this only adds and removes there, so a
stream whose settings change in the desired set is removed and added again with the new ones. A
stream this worker gives up (deleted from the fleet, changed to what its `sources:` policy refuses,
refused by the registry, or shed to spread the load) is removed from the registry but its lease is
kept until the run has ended, and only then handed back, so another worker takes it only once it
has stopped here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from realtime.config import AnyStreamSettings
from realtime.fleet.desired import DesiredStreams
from realtime.leases.keeper import LeaseKeeper
from realtime.streams.registry import (
    RegistryClosed,
    StreamExists,
    StreamLimitReached,
    StreamRegistry,
    UnknownStream,
)

log = logging.getLogger("realtime.fleet.worker")  # the worker's log name: filters on it keep matching


class LeasedRuns:
    def __init__(self, registry: StreamRegistry, desired: DesiredStreams,
                 keeper: Callable[[], LeaseKeeper | None]) -> None:
        self.registry = registry
        self.desired = desired
        self._keeper = keeper  # the worker opens it when it joins
        self.started: dict[str, AnyStreamSettings] = {}  # what this worker put into its registry
        self.handing_back: set[str] = set()  # leases kept until their runs have ended, then released

    def sync(self) -> None:
        """Remove what is no longer held or wanted as it runs, and add what is held and not running."""
        keeper = self._keeper()
        assert keeper is not None
        held = set(keeper.held())
        desired = set(self.desired.ids())
        for stream_id in held:
            if stream_id not in desired and stream_id not in self.handing_back:
                self.handing_back.add(stream_id)  # deleted from the fleet: stop it, then hand the lease back
        for stream_id, settings in list(self.started.items()):
            wanted = self.desired.settings(stream_id)
            if stream_id not in held or stream_id in self.handing_back or wanted != settings:
                del self.started[stream_id]
                with contextlib.suppress(UnknownStream, RegistryClosed):
                    self.registry.remove(stream_id)
        if self.registry.closing:
            return
        for stream_id in held - self.handing_back - set(self.started):
            wanted = self.desired.settings(stream_id)
            if wanted is None:
                continue
            if self.desired.refusal(stream_id) is not None:  # changed to what this worker may not open
                self.handing_back.add(stream_id)
                continue
            try:
                self.registry.add(wanted)
            except (StreamExists, StreamLimitReached, RegistryClosed) as exc:
                log.warning("cannot run a claimed stream; handing it back",
                            extra={"stream_id": stream_id, "error": str(exc) or type(exc).__name__})
                self.handing_back.add(stream_id)
                continue
            self.started[stream_id] = wanted

    async def release_ended(self, keeper: LeaseKeeper) -> None:
        """Hand back the leases being given up whose runs have ended."""
        for stream_id in list(self.handing_back):
            if not self.registry.active(stream_id):
                self.handing_back.discard(stream_id)
                await keeper.release(stream_id)

    def states(self) -> dict[str, str]:
        """Each started stream's state (live, stalled, ...), for the node record."""
        states = {}
        for stream_id in self.started:
            with contextlib.suppress(UnknownStream):
                states[stream_id] = self.registry.get(stream_id).state
        return states
