"""Home Assistant over MQTT: each stream a device, found by MQTT discovery, its states retained.

Home Assistant (and the hubs that read its discovery format) learn a device from retained config
messages under `<discovery_prefix>/<component>/<node_id>/<object_id>/config`, and read its states
from the topics those configs name. Events on NATS reach MQTT subscribers only live, and not in
the shape of a state, so this bridge turns a stream's events into what a hub needs to see the
present at any time, also after it restarts:

- a `binary_sensor` per rule, `ON` while any alert of that rule is open, with the newest alert's
  fields as its attributes;
- a `sensor` per counted class: the number of its objects tracked now (from `tracks` events);
- an `image`: the newest alert snapshot (JPEG);
- availability: the stream's (`online` while it is live) and this node's (the MQTT will).

Everything is kept by `RetainedTopics` (realtime.bus.mqtt), which sends it again after every
reconnect. The stream's rules and counted classes come from `describe` (the service reads them
from the stream's settings), asked when a stream is first seen and when a run of it starts.
Topic levels are stream and rule ids as they are (both `[A-Za-z0-9_-]`), and class and node
names made to fit (`slug`). Bounded: open alerts and tracks per stream (past them, counted and
ignored), topics and payload sizes (in RetainedTopics).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.event_bodies import AlertBody, StatusBody, TrackBody
from pipelines.events import Event
from realtime.bus.mqtt import OFFLINE, ONLINE, RetainedTopics

log = logging.getLogger(__name__)

ON = b"ON"
OFF = b"OFF"
MAX_OPEN_ALERTS = 1024  # per stream
MAX_TRACKS = 10_000  # per stream
SNAPSHOT_TIMEOUT_S = 10.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# Rules whose alert says something is there; the rest get no device class.
_DEVICE_CLASS = {"present": "occupancy", "count": "occupancy", "zone": "occupancy", "line": "motion",
                 "fall": "safety"}


def slug(name: str) -> str:
    """`name` as a topic level and entity id part: itself when it is `[A-Za-z0-9_-]+`, else the
    other characters as `_` and a short hash of the name, so two names never share one."""
    safe = _UNSAFE.sub("_", name)[:48]
    if safe == name and name:
        return name
    return f"{safe}_{hashlib.sha1(name.encode()).hexdigest()[:6]}"


@dataclass(frozen=True, slots=True)
class RuleEntity:
    rule_id: str
    rule_type: str


@dataclass(frozen=True, slots=True)
class StreamEntities:
    """What a stream shows in Home Assistant: its rules and the classes it counts."""

    rules: tuple[RuleEntity, ...]
    count_classes: tuple[str, ...]


@dataclass
class HassStats:
    alerts_dropped: int = 0  # open alerts past MAX_OPEN_ALERTS of a stream
    tracks_dropped: int = 0  # tracks past MAX_TRACKS of a stream
    snapshots: int = 0  # snapshot images published
    snapshot_failures: int = 0


@dataclass
class _Stream:
    entities: StreamEntities
    open: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # rule -> alert id -> attributes
    tracks: dict[int, str] = field(default_factory=dict)  # track id -> class
    topics: set[str] = field(default_factory=set)  # every topic of this stream kept retained


class HomeAssistantBridge:
    def __init__(
        self,
        retained: RetainedTopics,
        *,
        describe: Callable[[str], StreamEntities | None],
        snapshot: Callable[[str], Awaitable[bytes]] | None = None,
        discovery_prefix: str = "homeassistant",
        state_prefix: str = "vidsentry-ha",
        origin_version: str = "",
    ) -> None:
        self.retained = retained
        self.describe = describe
        self.snapshot = snapshot
        self.discovery_prefix = discovery_prefix
        self.state_prefix = state_prefix
        self.origin_version = origin_version
        self.stats = HassStats()
        self._streams: dict[str, _Stream] = {}
        self._snapshots: dict[str, str] = {}  # stream -> newest snapshot reference not fetched yet
        self._snapshot_wanted = asyncio.Event()

    # -- topics --------------------------------------------------------------------------------

    def node_id(self, stream_id: str) -> str:
        return f"vidsentry_{stream_id}"

    def stream_topic(self, stream_id: str, *levels: str) -> str:
        return "/".join((self.state_prefix, "stream", stream_id, *levels))

    def config_topic(self, component: str, stream_id: str, object_id: str) -> str:
        return f"{self.discovery_prefix}/{component}/{self.node_id(stream_id)}/{object_id}/config"

    def rule_topic(self, stream_id: str, rule_id: str) -> str:
        return self.stream_topic(stream_id, "rule", rule_id)

    def count_topic(self, stream_id: str, class_name: str) -> str:
        return self.stream_topic(stream_id, "count", slug(class_name))

    # -- events --------------------------------------------------------------------------------

    def tap(self, event: Event) -> None:
        """See one event (the service's tap: never blocks)."""
        body = event.body
        stream = self._streams.get(event.stream_id)
        if isinstance(body, StatusBody) and body.state == "connecting" and body.previous in (None, "stopped", "failed"):
            stream = self._describe(event.stream_id)  # a new run: nothing open yet, and its rules may have changed
        elif stream is None:
            stream = self._describe(event.stream_id)
        if stream is None:
            return  # not a stream of this service (any more)
        if isinstance(body, StatusBody):
            self.retained.set(self.stream_topic(event.stream_id, "availability"),
                              ONLINE if body.state == "live" else OFFLINE)
        elif isinstance(body, AlertBody):
            self._alert(event.stream_id, stream, body)
        elif isinstance(body, TrackBody):
            self._track(event.stream_id, stream, body)

    def forget(self, stream_id: str, *, remove: bool) -> None:
        """A stream is gone: `remove` deletes its device from the hub (it was deleted); otherwise
        (the service stops) it stays, unavailable, with its states as they were."""
        stream = self._streams.pop(stream_id, None)
        self._snapshots.pop(stream_id, None)
        if stream is None:
            return
        if remove:
            for topic in stream.topics:
                self.retained.clear(topic)
        else:
            self.retained.set(self.stream_topic(stream_id, "availability"), OFFLINE)

    def _describe(self, stream_id: str) -> _Stream | None:
        entities = self.describe(stream_id)
        if entities is None:
            return None
        old = self._streams.get(stream_id)
        stream = self._streams[stream_id] = _Stream(entities)
        topics = self._publish_entities(stream_id, stream)
        if old is not None:
            for topic in old.topics - topics:
                self.retained.clear(topic)
        stream.topics = topics
        return stream

    def _publish_entities(self, stream_id: str, stream: _Stream) -> set[str]:
        topics: set[str] = set()

        def keep(topic: str, payload: bytes) -> None:
            self.retained.set(topic, payload)
            topics.add(topic)

        availability = self.stream_topic(stream_id, "availability")
        keep(availability, self.retained.get(availability) or OFFLINE)
        for rule in stream.entities.rules:
            state = self.rule_topic(stream_id, rule.rule_id)
            config = self._entity(stream_id, f"rule_{rule.rule_id}", rule.rule_id, {
                "state_topic": state, "payload_on": ON.decode(), "payload_off": OFF.decode(),
                "json_attributes_topic": f"{state}/attributes",
            })
            if rule.rule_type in _DEVICE_CLASS:
                config["device_class"] = _DEVICE_CLASS[rule.rule_type]
            keep(self.config_topic("binary_sensor", stream_id, rule.rule_id), _json(config))
            keep(state, ON if stream.open.get(rule.rule_id) else OFF)
            topics.add(f"{state}/attributes")  # set once an alert starts
        for class_name in stream.entities.count_classes:
            object_id = f"count_{slug(class_name)}"
            state = self.count_topic(stream_id, class_name)
            keep(self.config_topic("sensor", stream_id, object_id), _json(self._entity(
                stream_id, object_id, f"{class_name} count",
                {"state_topic": state, "state_class": "measurement", "icon": "mdi:counter"})))
            keep(state, str(self._count(stream, class_name)).encode())
        if self.snapshot is not None:
            image = self.stream_topic(stream_id, "snapshot")
            keep(self.config_topic("image", stream_id, "snapshot"), _json(self._entity(
                stream_id, "snapshot", "Last alert snapshot", {"image_topic": image, "content_type": "image/jpeg"})))
            topics.add(image)  # set once a snapshot is fetched
        return topics

    def _entity(self, stream_id: str, object_id: str, name: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        node = self.node_id(stream_id)
        return {
            "name": name,
            "unique_id": f"{node}_{object_id}",
            **fields,
            "availability": [{"topic": self.retained.node_topic},
                             {"topic": self.stream_topic(stream_id, "availability")}],
            "availability_mode": "all",
            "qos": 1,
            "device": {"identifiers": [node], "name": stream_id, "manufacturer": "vidsentry", "model": "stream"},
            "origin": {"name": "vidsentry", "sw_version": self.origin_version},
        }

    def _alert(self, stream_id: str, stream: _Stream, body: AlertBody) -> None:
        alerts = stream.open.setdefault(body.rule_id, {})
        if body.event == "start":
            if sum(len(a) for a in stream.open.values()) >= MAX_OPEN_ALERTS:
                self.stats.alerts_dropped += 1
                return
            alerts[body.alert_id] = {"alert_id": body.alert_id, "severity": body.severity, "class": body.class_name,
                                     "track_ids": list(body.track_ids), "started_pts": body.started_pts}
            if body.snapshot and self.snapshot is not None:
                self._snapshots[stream_id] = body.snapshot
                self._snapshot_wanted.set()
        else:
            alerts.pop(body.alert_id, None)
        if body.rule_id not in {r.rule_id for r in stream.entities.rules}:
            return  # a rule added since the stream was described: shown once its next run starts
        state = self.rule_topic(stream_id, body.rule_id)
        newest = list(alerts.values())[-1] if alerts else None
        self.retained.set(f"{state}/attributes", _json({"open_alerts": len(alerts), "last_event": body.event,
                                                        "alert": newest}))
        self.retained.set(state, ON if alerts else OFF)

    def _track(self, stream_id: str, stream: _Stream, body: TrackBody) -> None:
        before = stream.tracks.get(body.track_id)
        if body.event == "end":
            stream.tracks.pop(body.track_id, None)
        elif before is None and len(stream.tracks) >= MAX_TRACKS:
            self.stats.tracks_dropped += 1
            return
        else:
            stream.tracks[body.track_id] = body.class_name
        for class_name in {before, body.class_name}:
            if class_name in stream.entities.count_classes:
                count = self._count(stream, class_name)
                self.retained.set(self.count_topic(stream_id, class_name), str(count).encode())

    @staticmethod
    def _count(stream: _Stream, class_name: str) -> int:
        return sum(1 for c in stream.tracks.values() if c == class_name)

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the topics on the broker and fetch snapshots, until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.retained.run(), name="mqtt-retained")
            if self.snapshot is not None:
                group.create_task(self._fetch_snapshots(), name="hass-snapshots")

    async def _fetch_snapshots(self) -> None:
        assert self.snapshot is not None
        while True:
            await self._snapshot_wanted.wait()
            self._snapshot_wanted.clear()
            while self._snapshots:
                stream_id = next(iter(self._snapshots))
                reference = self._snapshots.pop(stream_id)
                try:
                    async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):
                        jpeg = await self.snapshot(reference)
                except Exception as exc:  # a missing picture costs the image only
                    self.stats.snapshot_failures += 1
                    log.warning("alert snapshot not fetched stream_id=%s: %s", stream_id, type(exc).__name__)
                    continue
                if stream_id in self._streams and self.retained.set(self.stream_topic(stream_id, "snapshot"), jpeg):
                    self.stats.snapshots += 1


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=False).encode()


MAX_DEFAULT_CLASSES = 8  # a model with more classes counts none by default: name them (count_classes)


def entities_of(rules: Sequence[Any], count_classes: Sequence[str] | None,
                model_classes: Sequence[str] = ()) -> StreamEntities:
    """A stream's entities from its rules (each with `id` and `type`; `classes` where it has them)
    and the configured counted classes. None counts the classes its rules name, or when they name
    none, every class of a model with a few (the bundled one: Normal and Fall)."""
    if count_classes is None:
        named: dict[str, None] = {}
        for rule in rules:
            for name in getattr(rule, "classes", None) or ():
                named[name] = None
        count_classes = list(named) or (list(model_classes) if len(model_classes) <= MAX_DEFAULT_CLASSES else [])
    return StreamEntities(tuple(RuleEntity(r.id, r.type) for r in rules), tuple(dict.fromkeys(count_classes)))
