"""Scene descriptions in the service: each stream's newest description read back, and the
timeline's questions answered by the same VLM."""

from __future__ import annotations

import functools

from pipelines.describe.settings import DESCRIPTIONS
from realtime.bus.snapshots import NatsSnapshotStore
from realtime.http import description
from realtime.http.page import Panel, static
from realtime.service.plugin import Attached, PluginContext, ServicePlugin
from realtime.streams.descriptions import LatestDescriptions
from realtime.timeline.ask import Asker


def attach(ctx: PluginContext) -> Attached:
    store = LatestDescriptions()  # each stream's newest scene description (none with descriptions off)
    describer = ctx.engines.get(DESCRIPTIONS)
    timeline = ctx.timeline_api.timeline
    if describer is not None and timeline is not None:  # asking needs the index and a VLM
        snapshots = ctx.engines.snapshots
        ctx.timeline_api.asker = Asker(
            timeline.retrieve, describer.client, describer.model,
            snapshot=snapshots.get if isinstance(snapshots, NatsSnapshotStore) else None,
            timeout_s=max(5.0, ctx.config.http.request_timeout_s - 5.0))
    return Attached(taps=(store.tap,), routes=functools.partial(description.add_routes, store=store),
                    forget=(store.forget,), state=store)


# The newest description, in both modes; Watch fetches the last one when a stream is picked.
PANEL = Panel("scene", "Scene", static("scene.js"), kinds=("descriptions",), order=20)

PLUGIN = ServicePlugin(DESCRIPTIONS.name, attach, panels=(PANEL,))
