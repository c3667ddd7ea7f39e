"""The fleet's streams as any worker's API shows them: every desired stream with its owner and the
state its owner last recorded (`pending` while nobody holds it), and this worker's browser
sessions, which live on the worker that negotiated them. A stream running here shows its full
local view. A path this worker's policy refuses is shown as written, never resolved (resolving
would say whether the file exists)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from pipelines.graph.counters import zero_counters
from realtime.config import CameraStreamSettings, WebRtcStreamSettings
from realtime.fleet.desired import DesiredStreams
from realtime.fleet.owners import LeaseReader
from realtime.leases.records import NodeRecord
from realtime.streams.registry import StreamRegistry, UnknownStream
from realtime.streams.view import PENDING, StreamView, public_url

UNOWNED_REASON = "waiting for a worker with room to take it"


class FleetViews:
    def __init__(self, node: str, desired: DesiredStreams, leases: LeaseReader, registry: StreamRegistry,
                 started: Callable[[], Collection[str]]) -> None:
        self.node = node
        self.desired = desired
        self.leases = leases
        self.registry = registry
        self._started = started  # the fleet streams this worker put into its registry

    def all(self) -> list[dict[str, Any]]:
        owners, records = self.leases.owners(), self.leases.node_records()  # once for the whole listing
        out = [self._view(sid, owners, records) for sid in self.desired.ids()]
        local = {v["id"] for v in out}
        for view in self.registry.views():  # browser sessions live on the worker that negotiated them
            if view.stream_id not in local and isinstance(view.settings, WebRtcStreamSettings):
                out.append({**view.to_json(), "owner": self.node})
        return out

    def one(self, stream_id: str) -> dict[str, Any]:
        return self._view(stream_id, self.leases.owners(), self.leases.node_records())

    def _view(self, stream_id: str, owners: dict[str, str], records: dict[str, NodeRecord]) -> dict[str, Any]:
        settings = self.desired.settings(stream_id)
        if settings is None:
            if stream_id in self.registry:
                return {**self.registry.get(stream_id).to_json(), "owner": self.node}
            raise UnknownStream(stream_id)
        if stream_id in self._started() and stream_id in self.registry:
            return {**self.registry.get(stream_id).to_json(), "owner": self.node}
        owner = owners.get(stream_id)
        state, reason = PENDING, UNOWNED_REASON if owner is None else None
        refused = self.desired.refusal(stream_id)
        if refused is not None and owner is None:
            reason = f"this worker may not open it: {refused}"
        if owner is not None:
            record = records.get(owner)
            state = record.states.get(stream_id, PENDING) if record is not None else PENDING
        shown: str | None = None
        if isinstance(settings, CameraStreamSettings):
            # A refused path as written: public_url would look at the file (and say whether it exists).
            shown = settings.url if refused is not None else public_url(settings.url)
        view = StreamView(settings=settings, shown_url=shown, state=state, reason=reason, restarts=0,
                          restart_in=None, counters=zero_counters())
        return {**view.to_json(), "owner": owner}
