"""The service side of a capability, declared once, so that the service names no capability.

A capability's pipelines package (`pipelines/<name>/capability.py`) cannot name aiohttp or NATS,
so what it adds to the long-running service is declared here instead: one `ServicePlugin` per
capability that has service parts, in a module of its own (`PLUGIN`) that its capability names
(`Capability.service`), found by `realtime/service/plugins/__init__.py` (`SERVICE_PLUGINS`), in
the capabilities' order. `Service` attaches every plugin,
whether its capability is on or off, and wires what each returns; it never looks inside.

A plugin may use (`PluginContext`): the config, the shared engines (its own with
`ctx.engines.get(ITS_KEY)`, None when off), the stream registry, the publisher, the fleet
options (None outside a fleet), the HTTP context and the search routes' object
(it may give the timeline an asker). It adds (`Attached`): taps that see every event (read-back
stores), its HTTP routes, `/metrics` collectors, background tasks (run while the service runs,
cancelled at stop, named for logs), and what to forget when a stream is gone. It declares its
cards on the page (`panels`, realtime.http.page.Panel): data, shown whether its capability is on
or off, as its routes answer either way.

Adding a capability with service parts: its pipelines package, and one module building its
`ServicePlugin` (the built-in ones live in `realtime/service/plugins/`; with a card, its JS module
too, named by a `Panel`), named by the capability.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client.registry import Collector

from pipelines.events import Event
from pipelines.graph import SharedEngines
from realtime.bus.publisher import NatsEventPublisher
from realtime.config import Config
from realtime.http.context import HttpContext
from realtime.http.page import Panel
from realtime.http.search import TimelineApi
from realtime.leases.options import FleetOptions
from realtime.streams.registry import StreamRegistry


@dataclass(eq=False)
class PluginContext:
    """What a plugin may use."""

    config: Config
    engines: SharedEngines  # its capability's engine by its key; None: off as configured
    registry: StreamRegistry
    publisher: NatsEventPublisher
    fleet: FleetOptions | None  # None: this worker is in no fleet
    http: HttpContext
    timeline_api: TimelineApi  # the search routes' object (its timeline None when off); may get an asker


@dataclass(eq=False)
class Attached:
    """What a plugin adds to the service."""

    taps: tuple[Callable[[Event], None], ...] = ()  # see every event of every stream, in order; never block
    routes: Callable[[web.Application], None] | None = None  # its HTTP routes
    collectors: tuple[Collector, ...] = ()  # registered on the service's /metrics registry
    tasks: tuple[tuple[str, Callable[[], Coroutine[Any, Any, None]]], ...] = ()  # (name, run): cancelled at stop
    forget: tuple[Callable[[str], None], ...] = ()  # a stream is gone (by id)
    state: object = None  # what it keeps (its store, its fleet clips): `Service.plugin(name).state`


@dataclass(frozen=True, slots=True)
class ServicePlugin:
    capability: str  # its capability's name (pipelines.capabilities.CAPABILITIES), or its own for one of none
    attach: Callable[[PluginContext], Attached]
    panels: tuple[Panel, ...] = ()  # its cards on the page: a module, a title, the kinds it shows
