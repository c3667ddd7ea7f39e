"""Clips in the service: the clips API (it answers with clips off too), and in a fleet the fleet's
clips: every clip finished here goes to the fleet's bucket, and other workers' exports of streams
running here are cut here."""

from __future__ import annotations

import functools

from aiohttp import web

from pipelines.clips.engine import CLIPS
from realtime.fleet.clips import open_fleet_clips
from realtime.http import clips
from realtime.http.page import Panel, static
from realtime.service.engine_metrics import SampleCollector
from realtime.service.plugin import Attached, PluginContext, ServicePlugin


def attach(ctx: PluginContext) -> Attached:
    engine = ctx.engines.get(CLIPS)
    fleet_clips = open_fleet_clips(ctx.fleet, engine, ctx.publisher) if ctx.fleet is not None else None

    def routes(app: web.Application) -> None:
        clips.add_routes(app, engine, fleet_clips)

    if fleet_clips is None:
        return Attached(routes=routes)
    fleet_clips.exporter = functools.partial(clips.export_here, ctx.registry)
    return Attached(taps=(fleet_clips.tap,), routes=routes, collectors=(SampleCollector(fleet_clips.samples),),
                    tasks=(("fleet-clips", fleet_clips.run),), state=fleet_clips)


# The watched stream's clips and their player; a `clips` event lists them again.
PANEL = Panel("clips", "Clips", static("clips.js"), kinds=("clips",), modes=("watch",), order=40)

PLUGIN = ServicePlugin(CLIPS.name, attach, panels=(PANEL,))
