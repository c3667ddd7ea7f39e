"""The long-running service, assembled: one detector and batcher for every stream, the NATS
publisher behind the SSE fan-out, the stream registry and its reconciler, metrics, and the
HTTP server; and the order in which they stop.

Shutdown (`stop` is set): mutations get 503 and /readyz fails; the registry wants nothing
any more, so the reconciler stops every stream (each ends its open tracks and publishes its
`stopped` status); event viewers get what is queued and their responses end; the HTTP server
closes. Flushing and draining the publisher is left to its owner, after this returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from pipelines.detect import DetectionBatcher
from pipelines.events import Event
from pipelines.graph import SharedEngines
from pipelines.stages import DEFAULT_STAGES
from pipelines.tasks import cancel_and_wait
from realtime.bus.publisher import NatsEventPublisher
from realtime.bus.snapshots import NatsSnapshotStore
from realtime.config import AnyStreamSettings, Config, WebRtcStreamSettings
from realtime.fleet.metrics import FleetCollector
from realtime.fleet.worker import FleetWorker
from realtime.http import HttpContext, HttpServer, compute, create_app, page, search, signalling, whep, whip
from realtime.http.api import FLEET, SOURCE_POLICY
from realtime.http.history import JetStreamHistory
from realtime.http.hosts import HostPolicy
from realtime.http.metrics import MetricSources, ServiceMetrics
from realtime.http.resume import ResumeSettings
from realtime.leases.options import fleet_options
from realtime.service.engine_metrics import ComputeCollector, capability_collector
from realtime.service.memory import release_free_memory
from realtime.service.plugin import Attached, PluginContext
from realtime.service.plugins import SERVICE_PLUGINS
from realtime.streams.fanout import EventFanout
from realtime.streams.registry import RegistryClosed, StreamRegistry, UnknownStream
from realtime.streams.runner import StreamRunner
from realtime.streams.spec import stream_spec
from realtime.streams.view import StreamView
from realtime.timeline.timeline import Timeline, TimelineCollector
from realtime.webrtc.live import LiveView
from realtime.webrtc.metrics import SessionCollector, ViewerCollector
from realtime.webrtc.sessions import SessionTable

log = logging.getLogger(__name__)

HEALTH_LOG_INTERVAL_S = 30.0


def outbox_depth(publisher: NatsEventPublisher, config: Config) -> tuple[int, int] | None:
    """(events, bytes) waiting in the disk outbox, or None when none is configured."""
    if config.nats.outbox_dir is None:
        return None
    stats = publisher.stats
    return stats.outbox_depth, stats.outbox_bytes


class Service:
    def __init__(
        self,
        config: Config,
        batcher: DetectionBatcher,
        publisher: NatsEventPublisher,
        *,
        api_token: str | None = None,
        opened: Mapping[str, object] | None = None,
        timeline: Timeline | None = None,
    ) -> None:
        """`opened`: each capability's shared engine by name (pipelines.capabilities.open_capabilities);
        `timeline`: the search index and its indexer (realtime.timeline), None when off."""
        opened = dict(opened or {})
        self.config = config
        self.batcher = batcher
        self.publisher = publisher
        http = config.http
        fleet = fleet_options(config)
        # What the capabilities' service plugins add (realtime.service.plugin), filled in below: the
        # fanout is built first, since their context holds the HTTP context, which holds the fanout.
        self._attached: dict[str, Attached] = {}
        self._taps: list[Callable[[Event], None]] = []  # theirs in order, flat: read for every event
        self.fanout = EventFanout(
            publisher,
            node=config.node,
            queue_limit=http.sse_queue_events,
            max_viewers_per_stream=http.sse_max_viewers_per_stream,
            max_viewers=http.sse_max_viewers,
            taps=(self._tap,),  # the plugins' taps, in their order
        )
        self.metrics = ServiceMetrics(
            MetricSources(
                streams=self._views,
                active_runs=lambda: self.registry.running_count,
                publisher=lambda: publisher.stats,
                batcher=lambda: batcher.stats,
                sse_viewers=lambda: self.fanout.viewer_count,
                sse_dropped=lambda: self.fanout.dropped_total,
                sse_rejected=lambda: self.fanout.rejected,
                sse_open_alerts_forgotten=lambda: self.fanout.open_alerts_forgotten,
                max_streams=lambda: self.registry.max_streams,
                streams_rejected=lambda: self.registry.rejected,
                publisher_alive=lambda: publisher.alive,
                detector_alive=lambda: batcher.alive,
                detector_oldest_call_s=batcher.oldest_call_s,
                outbox_depth=lambda: outbox_depth(publisher, config),
            )
        )
        # Alert snapshots share the publisher's connection (the bucket is created on first use).
        self.engines = SharedEngines(batcher, NatsSnapshotStore(publisher), opened)
        self.registry = StreamRegistry(self._make_runner, on_gone=self._stream_gone, max_streams=http.max_streams)
        # In a fleet the desired set lives in NATS KV and this registry runs only the streams leased here.
        self.fleet = FleetWorker(fleet, self.registry, lambda: publisher.nc) if fleet is not None else None
        self.context = HttpContext(
            registry=self.registry,
            fanout=self.fanout,
            metrics=self.metrics,
            readiness=self.readiness,
            api_token=api_token.encode("utf-8") if api_token else None,
            sse_heartbeat_s=config.http.sse_heartbeat_s,
            class_names=batcher.detector.info.names,
            capabilities_on=frozenset(opened),  # their rule types may be given
            engines=dict(opened),
            # Reconnecting event viewers resume from JetStream, over the publisher's connection.
            history=JetStreamHistory(lambda: publisher.nc),
            resume=ResumeSettings(http.sse_resume_window_s, http.sse_resume_max_events),
            request_timeout_s=http.request_timeout_s,
        )
        # Browser sessions: each one is a `webrtc` stream in the registry while it lasts.
        self.sessions = SessionTable(
            config.webrtc, admit=self.registry.add, forget=self._forget_session, listen=self.fanout.listen
        )
        self.metrics.registry.register(SessionCollector(self.sessions))
        # Live viewers (WHEP): each stream that demuxes hands its packets to a feed here too.
        self.live = LiveView(config.webrtc)
        self.metrics.registry.register(ViewerCollector(self.live))
        self.metrics.registry.register(capability_collector(opened))
        if batcher.compute is not None:  # one budget for every model on the CPU
            self.metrics.registry.register(ComputeCollector(batcher.compute))
        self.app = create_app(self.context)
        self.app[SOURCE_POLICY] = config.sources.to_policy()  # what API clients may add
        if self.fleet is not None:
            self.app[FLEET] = self.fleet
            self.metrics.registry.register(FleetCollector(self.fleet))
        signalling.add_routes(self.app, self.sessions)
        whip.add_routes(self.app)
        whep.add_routes(self.app, self.live)
        compute.add_routes(self.app, batcher.compute)
        self.timeline = timeline
        timeline_api = search.add_routes(self.app, timeline)  # answers with the timeline off too
        plugin_context = PluginContext(config=config, engines=self.engines, registry=self.registry,
                                       publisher=publisher, fleet=fleet, http=self.context,
                                       timeline_api=timeline_api)
        for plugin in SERVICE_PLUGINS:  # each attaches with its capability off too (its routes answer)
            attached = self._attached[plugin.capability] = plugin.attach(plugin_context)
            page.add_panels(self.app, plugin.panels)
            self._taps.extend(attached.taps)
            if attached.routes is not None:
                attached.routes(self.app)
            for collector in attached.collectors:
                self.metrics.registry.register(collector)
        if timeline is not None:  # a plugin may have given it an asker
            self.metrics.registry.register(TimelineCollector(timeline, timeline_api.asker))
        self.url: str | None = None

    def plugin(self, capability: str) -> Attached:
        """What the capability's service plugin added (KeyError: it has none); `.state` is what it keeps."""
        return self._attached[capability]

    def readiness(self) -> dict[str, bool]:
        """Every precondition of processing, by name: the shared engines' tasks are alive, the
        publisher's background tasks too, NATS is connected, its VIDSENTRY stream is there to
        store durable events (false while a missing stream is checked for or made again), and the
        disk outbox (when there is one) can write."""
        checks = {
            "nats": self.publisher.connected,
            "jetstream": self.publisher.durable_ready,
            "publisher": self.publisher.alive,
            **self.engines.health(),
        }
        if self.publisher.outbox is not None:
            checks["outbox"] = self.publisher.outbox_writable
        if self.fleet is not None:
            checks["fleet"] = self.fleet.ready
        return checks

    async def run(
        self, host: str, port: int, stop: asyncio.Event, *, on_listening: Callable[[str], None] | None = None
    ) -> None:
        """Serve until `stop` is set, then shut down in order. ListenError if the address is unusable."""
        http = self.config.http
        self.context.hosts = HostPolicy(host, http.allowed_hosts, token_set=self.context.api_token is not None)
        server = HttpServer(self.app, max_connections=http.max_connections, idle_timeout_s=http.idle_timeout_s)
        self.url = await server.start(host, port)  # before any stream starts: a bad address costs nothing
        # A source on the service's own port would have it read itself: refused for API and fleet streams.
        self.app[SOURCE_POLICY].own_ports.add(urlsplit(self.url).port or port)
        try:
            if self.fleet is not None:
                await self.fleet.start(self.config.streams)  # seeds the config's streams into the fleet
            elif not stop.is_set():  # a signal during start-up: no stream needs starting only to stop
                self.registry.apply(self.config.streams)
            log.info(
                "service listening",
                extra={
                    "url": self.url,
                    "streams": len(self.config.streams),
                    "auth": "token" if self.context.api_token else "none",
                },
            )
            if on_listening is not None:
                on_listening(self.url)
            async with asyncio.TaskGroup() as group:
                reconciler = group.create_task(self.registry.run(), name="stream-reconciler")
                helpers = [
                    group.create_task(self.metrics.sample_rates(), name="frame-rates"),
                    group.create_task(self._report_health(), name="health-log"),
                ]
                if self.timeline is not None:
                    helpers.append(group.create_task(self.timeline.run(), name="timeline-indexer"))
                helpers += [group.create_task(run(), name=name)
                            for attached in self._attached.values() for name, run in attached.tasks]
                fleet_task = group.create_task(self.fleet.run(), name="fleet") if self.fleet is not None else None
                try:
                    await stop.wait()
                finally:
                    if self.fleet is not None:
                        self.fleet.drain()  # claim nothing more; leases stay renewed while streams stop
                    await self._stop_streams(reconciler)
                    if self.fleet is not None:
                        await self.fleet.stop()  # hand the leases back: other workers take over at once
                    for task in [*helpers, *([fleet_task] if fleet_task is not None else [])]:
                        task.cancel()
        finally:
            self.fanout.close()
            await server.stop()
            await self.metrics.aclose()

    async def _stop_streams(self, reconciler: asyncio.Task[None]) -> None:
        self.context.draining = True
        log.info("draining: stopping streams", extra={"running": self.registry.running_count})
        self.registry.close()
        timeout = self.config.http.shutdown_timeout_s
        done, _ = await asyncio.wait({reconciler}, timeout=timeout)
        if not done:
            log.warning(
                "streams did not stop in time; cancelling them",
                extra={"timeout_s": timeout, "running": self.registry.running_count},
            )
            await cancel_and_wait(reconciler)
        await self.sessions.aclose()  # sessions negotiated but never started, too
        await self.live.aclose()

    def _make_runner(self, settings: AnyStreamSettings) -> StreamRunner:
        config = self.config
        # The config file's streams are trusted; one an API client added gives generic failure reasons.
        # (A fleet stream is read back from KV: the same settings as the config's count.)
        fleet = self.fleet is not None and self.fleet.is_fleet_stream(settings.id)
        trusted = any(settings is stream or (fleet and settings == stream) for stream in config.streams)
        source = self.sessions.source(settings.id) if isinstance(settings, WebRtcStreamSettings) else None
        # A fleet stream publishes only while this worker's lease on it is valid, with its fencing token.
        sink = self.fleet.sink_for(settings.id, self.fanout) if fleet and self.fleet is not None else self.fanout
        return StreamRunner(
            stream_spec(settings, tracker=config.tracker, supervisor=config.supervisor, trusted=trusted,
                        source_policy=self.app[SOURCE_POLICY]),  # checked again at every (re)connect
            self.engines,
            sink,
            on_frame=self.metrics.frame_observer(settings.id),
            stages=(*DEFAULT_STAGES, self.live.build),
            source=source,
        )

    def _forget_session(self, stream_id: str) -> None:
        """A browser session ended: its stream leaves the desired set (a DELETE may have done it)."""
        with contextlib.suppress(UnknownStream, RegistryClosed):
            self.registry.remove(stream_id)

    def _stream_gone(self, stream_id: str) -> None:
        self.fanout.close_stream(stream_id)
        for attached in self._attached.values():
            for forget in attached.forget:
                forget(stream_id)
        self.sessions.discard(stream_id)
        self.live.forget(stream_id)
        self.metrics.forget(stream_id)
        release_free_memory()

    def _tap(self, event: Event) -> None:
        for tap in self._taps:
            tap(event)

    def _views(self) -> list[StreamView]:
        return self.registry.views()

    async def _report_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_LOG_INTERVAL_S)
            views = self.registry.views()
            totals = self.publisher.stats.totals()
            log.info(
                "service health",
                extra={
                    "streams": len(views),
                    "live": sum(1 for v in views if v.state == "live"),
                    "nats_connected": self.publisher.connected,
                    "events_published": totals.published,
                    "events_failed": totals.failed,
                    "sse_viewers": self.fanout.viewer_count,
                },
            )
            for view in views:
                fps_in, fps_processed, fps_dropped = self.metrics.rates.rates(view.stream_id)
                c = view.counters
                log.info(
                    "stream health",
                    extra={
                        "stream_id": view.stream_id,
                        "state": view.state,
                        "reason": view.reason,
                        "fps_in": round(fps_in, 1),
                        "fps_processed": round(fps_processed, 1),
                        "fps_dropped": round(fps_dropped, 1),
                        "frames_processed": c.get("frames_processed", 0),
                        "reconnects": c.get("reconnects", 0),
                        "stalls": c.get("stalls", 0),
                    },
                )
