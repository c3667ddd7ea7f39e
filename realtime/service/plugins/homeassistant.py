"""Home Assistant in the service (section `homeassistant:`, docs/mqtt.md): every stream a device
found by MQTT discovery, its rules, counts and newest alert snapshot kept as retained states.

It belongs to no capability: it is fed by every stream's events, as the capabilities' plugins
are, and so is one of them (named `homeassistant`, before those of the capabilities). It talks MQTT
to the NATS server's own listener (`nats.mqtt_port`): the embedded server's, or an external
server's on the host of the NATS URL.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from importlib import metadata
from urllib.parse import urlsplit

from pipelines.capability import Sample
from realtime.bus.hass import HomeAssistantBridge, StreamEntities, entities_of, slug
from realtime.bus.mqtt import MqttTarget, RetainedTopics
from realtime.bus.snapshots import NatsSnapshotStore
from realtime.config import Config, HomeAssistantSettings
from realtime.service.engine_metrics import SampleCollector
from realtime.service.plugin import Attached, PluginContext, ServicePlugin
from realtime.streams.registry import StreamRegistry, UnknownStream

NAME = "homeassistant"


def mqtt_target(config: Config, nats_url: str) -> MqttTarget:
    """The MQTT listener of the NATS server at `nats_url` (its first server), as `nats.mqtt_*` say."""
    nats = config.nats
    assert nats.mqtt_port is not None  # the config refuses homeassistant.enabled without it
    host = urlsplit(nats_url.split(",", maxsplit=1)[0].strip()).hostname or "127.0.0.1"
    # The embedded server is reached on loopback; its MQTT listener may be on one other address only.
    if _loopback(host) and not _loopback(nats.mqtt_host) and nats.mqtt_host not in ("0.0.0.0", "::"):
        host = nats.mqtt_host
    password = nats.mqtt_password.get_secret_value() if nats.mqtt_password is not None else None
    return MqttTarget(host, nats.mqtt_port, nats.mqtt_username, password)


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def describer(registry: StreamRegistry, settings: HomeAssistantSettings,
              model_classes: Sequence[str]) -> Callable[[str], StreamEntities | None]:
    """A stream's entities from its settings as the registry holds them (None: not a stream here)."""

    def describe(stream_id: str) -> StreamEntities | None:
        try:
            stream = registry.get(stream_id).settings
        except UnknownStream:
            return None
        return entities_of(stream.rules, settings.count_classes, model_classes)
    return describe


def build_bridge(ctx: PluginContext) -> HomeAssistantBridge:
    settings: HomeAssistantSettings = ctx.config.section(NAME)
    node = slug(ctx.config.node)
    retained = RetainedTopics(mqtt_target(ctx.config, ctx.publisher.url), client_id=f"vidsentry-{node}",
                              node_topic=f"{settings.state_prefix}/node/{node}/availability",
                              resend_on=f"{settings.discovery_prefix}/status")  # Home Assistant's birth message
    snapshots = ctx.engines.snapshots
    fetch = snapshots.get if settings.snapshot and isinstance(snapshots, NatsSnapshotStore) else None
    describe = describer(ctx.registry, settings, list(ctx.http.class_names.values()))
    return HomeAssistantBridge(retained, describe=describe, snapshot=fetch,
                               discovery_prefix=settings.discovery_prefix, state_prefix=settings.state_prefix,
                               origin_version=_version())


def _version() -> str:
    try:
        return metadata.version("vidsentry")
    except metadata.PackageNotFoundError:
        return ""


def samples(bridge: HomeAssistantBridge) -> list[Sample]:
    mqtt, hass = bridge.retained.stats, bridge.stats
    return [
        Sample("vidsentry_mqtt_connected", "1 while connected to the MQTT listener", float(bridge.retained.connected),
               "gauge"),
        Sample("vidsentry_mqtt_retained_topics", "topics kept retained for Home Assistant",
               float(len(bridge.retained.topics())), "gauge"),
        Sample("vidsentry_mqtt_published", "retained messages the MQTT broker acknowledged", float(mqtt.published)),
        Sample("vidsentry_mqtt_refused", "retained topics refused by a bound", float(mqtt.refused_topics),
               labels=(("bound", "topics"),)),
        Sample("vidsentry_mqtt_refused", "retained topics refused by a bound", float(mqtt.refused_payloads),
               labels=(("bound", "payload"),)),
        Sample("vidsentry_hass_dropped", "alerts and tracks past the per-stream bounds", float(hass.alerts_dropped),
               labels=(("what", "alerts"),)),
        Sample("vidsentry_hass_dropped", "alerts and tracks past the per-stream bounds", float(hass.tracks_dropped),
               labels=(("what", "tracks"),)),
        Sample("vidsentry_hass_snapshot_failures", "alert snapshots that could not be fetched",
               float(hass.snapshot_failures)),
    ]


def attach(ctx: PluginContext) -> Attached:
    if not ctx.config.section(NAME).enabled:
        return Attached()
    bridge = build_bridge(ctx)
    registry, fleet = ctx.registry, ctx.fleet

    def forget(stream_id: str) -> None:
        # A deleted stream leaves the hub; at shutdown, or when another worker of a fleet takes
        # it over, it stays (unavailable here), so the hub keeps its entities and history.
        bridge.forget(stream_id, remove=fleet is None and not registry.closing)

    return Attached(taps=(bridge.tap,), tasks=(("homeassistant", bridge.run),), forget=(forget,),
                    collectors=(SampleCollector(lambda: samples(bridge)),), state=bridge)


PLUGIN = ServicePlugin(NAME, attach)
