"""Home Assistant over MQTT (realtime.bus.hass on realtime.bus.mqtt), against the real nats-server
and its MQTT listener, read by a real MQTT 3.1.1 client (paho-mqtt) as a hub would: discovery
configs arrive retained, an alert turns its sensor on and off, and a restart of the hub, of the
NATS server or of vidsentry's side keeps the present."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
import pytest

from pipelines.event_bodies import AlertBody, StatusBody, TrackBody
from pipelines.events import Event
from realtime.bus import cloudevents
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.hass import HomeAssistantBridge, RuleEntity, StreamEntities, entities_of, slug
from realtime.bus.mqtt import MqttSettingsError, MqttTarget, RetainedTopics, check_topic
from tests.support.mqtt import MqttWatcher, Received, mqtt_port
from tests.support.waiting import wait_until

CAM = "plaza"
ENTITIES = StreamEntities((RuleEntity("east-side", "zone"),), ("person", "traffic light"))
HUB_TOPICS = ["homeassistant/#", "vidsentry-ha/#"]
NODE_TOPIC = "vidsentry-ha/node/test/availability"
RULE_STATE = f"vidsentry-ha/stream/{CAM}/rule/east-side"
PERSONS = f"vidsentry-ha/stream/{CAM}/count/person"
AVAILABILITY = f"vidsentry-ha/stream/{CAM}/availability"
SNAPSHOT = f"vidsentry-ha/stream/{CAM}/snapshot"


def event(body: StatusBody | AlertBody | TrackBody, stream_id: str = CAM) -> Event:
    return Event(stream_id=stream_id, pts=None if isinstance(body, StatusBody) else 1.0, captured_at=time.time(),
                 body=body)


def status(state: str, previous: str | None) -> Event:
    return event(StatusBody(state=state, previous=previous, reason=None, attempt=1, retry_in=None, source="file"))


def alert(kind: str, alert_id: str = "a1", snapshot: str | None = None) -> Event:
    return event(AlertBody(alert_id=alert_id, rule_id="east-side", rule_type="zone", event=kind, severity="warning",
                           track_ids=(7,), class_name="person", evidence={}, started_pts=1.0,
                           ended_pts=2.0 if kind == "end" else None, duration_s=1.0 if kind == "end" else None,
                           snapshot=snapshot))


def track(kind: str, track_id: int = 7, class_name: str = "person") -> Event:
    return event(TrackBody(event=kind, track_id=track_id, class_name=class_name, class_id=0, score=0.9,
                           box=(0.0, 0.0, 10.0, 20.0), first_seen_pts=1.0, last_seen_pts=1.0, duration_s=0.0, hits=3))


def bridge_for(server: EmbeddedNatsServer, *, snapshot: Callable[[str], Awaitable[bytes]] | None = None,
               described: dict[str, StreamEntities] | None = None) -> HomeAssistantBridge:
    retained = RetainedTopics(MqttTarget("127.0.0.1", mqtt_port(server)), client_id="vidsentry-test",
                              node_topic=NODE_TOPIC, resend_on="homeassistant/status")
    streams = {CAM: ENTITIES} if described is None else described
    return HomeAssistantBridge(retained, describe=streams.get, snapshot=snapshot, origin_version="test")


@pytest.fixture
async def running() -> AsyncIterator[Callable[[HomeAssistantBridge], Awaitable[None]]]:
    """Runs bridges until the test ends (cancelled then: a clean close)."""
    tasks: list[asyncio.Task[None]] = []

    async def run(bridge: HomeAssistantBridge) -> None:
        tasks.append(asyncio.create_task(bridge.run()))
        await wait_until(lambda: bridge.retained.connected, 10.0, "the bridge's MQTT connection")

    yield run
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_discovery_configs_arrive_retained_and_an_alert_turns_its_sensor_on_and_off(
    mqtt_server: EmbeddedNatsServer, running: Callable[[HomeAssistantBridge], Awaitable[None]]
) -> None:
    async def jpeg(reference: str) -> bytes:
        assert reference == "nats-object://vidsentry-snapshots/k1"
        return b"\xff\xd8jpeg"

    bridge = bridge_for(mqtt_server, snapshot=jpeg)
    await running(bridge)
    bridge.tap(status("connecting", None))
    bridge.tap(status("live", "connecting"))
    assert await bridge.retained.flushed(10.0)
    # The hub subscribes after the fact: all it learns comes from retained messages.
    with MqttWatcher(mqtt_port(mqtt_server), HUB_TOPICS) as hub:
        rule_config = f"homeassistant/binary_sensor/vidsentry_{CAM}/east-side/config"
        light = slug("traffic light")
        configs = [rule_config, f"homeassistant/sensor/vidsentry_{CAM}/count_person/config",
                   f"homeassistant/sensor/vidsentry_{CAM}/count_{light}/config",
                   f"homeassistant/image/vidsentry_{CAM}/snapshot/config"]
        # nats-server sends a new subscription's retained messages in no set order: wait for each.
        await wait_until(lambda: all(hub.latest(t) for t in [*configs, RULE_STATE, PERSONS, AVAILABILITY, NODE_TOPIC]),
                         10.0, lambda: f"retained configs and states, got {sorted(hub.matching(''))}")
        assert all(hub.matching("")[t].retain for t in [*configs, RULE_STATE, PERSONS, AVAILABILITY, NODE_TOPIC])
        rule = json.loads(hub.payload(rule_config) or b"")
        assert rule["state_topic"] == RULE_STATE and (rule["payload_on"], rule["payload_off"]) == ("ON", "OFF")
        assert rule["device"]["identifiers"] == [f"vidsentry_{CAM}"]
        assert rule["unique_id"] == f"vidsentry_{CAM}_rule_east-side"
        assert [a["topic"] for a in rule["availability"]] == [NODE_TOPIC, AVAILABILITY]
        image = json.loads(hub.payload(configs[-1]) or b"")
        assert image["image_topic"] == SNAPSHOT and image["content_type"] == "image/jpeg"
        assert json.loads(hub.payload(configs[2]) or b"")["name"] == "traffic light count"
        assert (hub.payload(RULE_STATE), hub.payload(PERSONS), hub.payload(AVAILABILITY), hub.payload(NODE_TOPIC)) \
            == (b"OFF", b"0", b"online", b"online")

        bridge.tap(track("new"))
        bridge.tap(alert("start", snapshot="nats-object://vidsentry-snapshots/k1"))
        await hub.wait_for(RULE_STATE, b"ON")
        await hub.wait_for(PERSONS, b"1")
        await hub.wait_for(SNAPSHOT, b"\xff\xd8jpeg")
        attributes = json.loads(hub.payload(f"{RULE_STATE}/attributes") or b"")
        assert attributes["open_alerts"] == 1 and attributes["alert"]["alert_id"] == "a1"
        bridge.tap(alert("start", alert_id="a2"))  # a second alert of the rule: still on until both end
        bridge.tap(alert("end"))
        assert await bridge.retained.flushed(10.0)
        assert bridge.retained.get(RULE_STATE) == b"ON"
        bridge.tap(alert("end", alert_id="a2"))
        bridge.tap(track("end"))
        await hub.wait_for(RULE_STATE, b"OFF")
        await hub.wait_for(PERSONS, b"0")


async def test_an_alert_that_starts_and_ends_at_once_is_seen_on_then_off(
    mqtt_server: EmbeddedNatsServer, running: Callable[[HomeAssistantBridge], Awaitable[None]]
) -> None:
    bridge = bridge_for(mqtt_server)
    await running(bridge)
    bridge.tap(status("live", "connecting"))
    assert await bridge.retained.flushed(10.0)
    with MqttWatcher(mqtt_port(mqtt_server), [RULE_STATE]) as hub:
        await hub.ready()
        await hub.wait_for(RULE_STATE, b"OFF")
        bridge.tap(alert("start"))  # a line crossing: its end follows in the same moment
        bridge.tap(alert("end"))
        await wait_until(lambda: [m.payload for m in hub.messages][-2:] == [b"ON", b"OFF"], 10.0,
                         lambda: f"ON then OFF, got {[m.payload for m in hub.messages]}")


async def test_a_hub_that_restarts_sees_the_present(
    mqtt_server: EmbeddedNatsServer, running: Callable[[HomeAssistantBridge], Awaitable[None]]
) -> None:
    bridge = bridge_for(mqtt_server)
    await running(bridge)
    bridge.tap(status("live", "connecting"))
    with MqttWatcher(mqtt_port(mqtt_server), HUB_TOPICS) as hub:
        await hub.ready()
        bridge.tap(alert("start"))
        await hub.wait_for(RULE_STATE, b"ON")
        assert not hub.latest(RULE_STATE).retain  # type: ignore[union-attr]  # live, to a hub already there
    with MqttWatcher(mqtt_port(mqtt_server), HUB_TOPICS, client_id="hub-again") as hub:
        assert (await hub.wait_for(RULE_STATE, b"ON")).retain
        assert (await hub.wait_for(AVAILABILITY, b"online")).retain


async def test_a_hub_coming_online_has_everything_sent_again(
    mqtt_server: EmbeddedNatsServer, running: Callable[[HomeAssistantBridge], Awaitable[None]]
) -> None:
    retained = RetainedTopics(MqttTarget("127.0.0.1", mqtt_port(mqtt_server)), client_id="vidsentry-test",
                              node_topic=NODE_TOPIC, resend_on="homeassistant/status")
    bridge = HomeAssistantBridge(retained, describe={CAM: ENTITIES}.get)
    await running(bridge)
    bridge.tap(alert("start"))
    assert await retained.flushed(10.0)
    with MqttWatcher(mqtt_port(mqtt_server), [RULE_STATE, NODE_TOPIC]) as hub:
        await hub.ready()
        await hub.wait_for(RULE_STATE, b"ON")
        seen = len(hub.messages)
        # Home Assistant's birth message, as it sends it once it has (re)subscribed.
        await asyncio.to_thread(hub.publish, "homeassistant/status", b"online")
        again = {Received(RULE_STATE, b"ON", retain=False), Received(NODE_TOPIC, b"online", retain=False)}
        # The node's availability too: every entity names it, and a hub that missed it shows them unavailable.
        await wait_until(lambda: again <= set(hub.messages[seen:]), 10.0,
                         lambda: f"the states sent again: {hub.messages[seen:]}")
        assert retained.stats.resends == 1


async def retained_after_start(port: int, topics: list[str], attempts: int = 10) -> dict[str, Received]:
    """The retained messages of `topics`, as a hub subscribing now gets them. The first MQTT
    client after a server start sets up the account's MQTT state, loading the retained messages
    meanwhile: a subscription in that moment can find none (nats-server 2.15), so a hub that got
    nothing within a second tries again, as a new session."""
    for attempt in range(attempts):
        with MqttWatcher(port, topics, client_id=f"hub-{attempt}") as hub:
            await hub.ready()
            try:
                await wait_until(lambda: all(hub.latest(t) for t in topics), 1.0, "retained messages")
            except AssertionError:
                continue
            found = {t: hub.latest(t) for t in topics}
            assert all(m is not None and m.retain for m in found.values())
            return {t: m for t, m in found.items() if m is not None}
    raise AssertionError(f"no retained {topics} after {attempts} tries")


async def test_the_state_outlives_a_restart_of_the_nats_server(
    mqtt_server: EmbeddedNatsServer, running: Callable[[HomeAssistantBridge], Awaitable[None]]
) -> None:
    first = bridge_for(mqtt_server)
    task = asyncio.create_task(first.run())
    await wait_until(lambda: first.retained.connected, 10.0, "the bridge's connection")
    first.tap(alert("start"))
    assert await first.retained.flushed(10.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    # Nobody publishes now: what the hub finds after the restart was kept in JetStream's store.
    await asyncio.to_thread(mqtt_server.restart)
    found = await retained_after_start(mqtt_port(mqtt_server), [RULE_STATE, NODE_TOPIC])
    assert (found[RULE_STATE].payload, found[NODE_TOPIC].payload) == (b"ON", b"offline")

    # A bridge running through a restart reconnects and goes on.
    bridge = bridge_for(mqtt_server)
    await running(bridge)
    await asyncio.to_thread(mqtt_server.restart)
    await wait_until(lambda: bridge.retained.stats.connects == 2 and bridge.retained.connected, 15.0,
                     "the bridge to reconnect")
    with MqttWatcher(mqtt_port(mqtt_server), HUB_TOPICS) as hub:
        await hub.ready()
        bridge.tap(alert("end"))
        await hub.wait_for(RULE_STATE, b"OFF")


async def test_a_restarted_vidsentry_publishes_the_present_and_its_node_goes_offline_between(
    mqtt_server: EmbeddedNatsServer, running: Callable[[HomeAssistantBridge], Awaitable[None]]
) -> None:
    first = bridge_for(mqtt_server)
    task = asyncio.create_task(first.run())
    await wait_until(lambda: first.retained.connected, 10.0, "the first bridge's connection")
    first.tap(status("live", "connecting"))
    first.tap(alert("start"))
    assert await first.retained.flushed(10.0)
    task.cancel()  # stops as the service does: what was set is flushed, then the node is offline
    await asyncio.gather(task, return_exceptions=True)
    with MqttWatcher(mqtt_port(mqtt_server), HUB_TOPICS) as hub:
        await hub.ready()
        await hub.wait_for(NODE_TOPIC, b"offline")
        # Retained messages come in no set order: wait for this one too, before the second starts.
        await hub.wait_for(RULE_STATE, b"ON")  # as it was last known; unavailable through the node
        second = bridge_for(mqtt_server)
        await running(second)
        second.tap(status("connecting", None))  # the stream's new run: nothing open
        await hub.wait_for(NODE_TOPIC, b"online")
        await hub.wait_for(RULE_STATE, b"OFF")


async def test_a_deleted_stream_leaves_the_hub_and_a_stopped_one_stays_unavailable(
    mqtt_server: EmbeddedNatsServer, running: Callable[[HomeAssistantBridge], Awaitable[None]]
) -> None:
    bridge = bridge_for(mqtt_server, described={CAM: ENTITIES, "gate": ENTITIES})
    await running(bridge)
    bridge.tap(status("live", "connecting"))
    bridge.tap(event(StatusBody(state="live", previous="connecting", reason=None, attempt=1, retry_in=None,
                                source="file"), "gate"))
    bridge.forget(CAM, remove=True)
    bridge.forget("gate", remove=False)
    assert await bridge.retained.flushed(10.0)
    kept = {topic: bridge.retained.get(topic) for topic in bridge.retained.topics()}
    assert kept["vidsentry-ha/stream/gate/availability"] == b"offline"
    assert "homeassistant/binary_sensor/vidsentry_gate/east-side/config" in kept
    with MqttWatcher(mqtt_port(mqtt_server), HUB_TOPICS) as hub:
        # Retained messages come in no set order: once every one the bridge keeps has come, a
        # deleted stream's topic would have come too.
        await wait_until(lambda: all(hub.payload(t) == p for t, p in kept.items()), 10.0,
                         lambda: f"the retained {sorted(set(kept) - set(hub.matching('')))}")
        assert not [t for t in hub.matching("") if f"/{CAM}/" in t or f"_{CAM}/" in t]


async def test_events_reach_mqtt_subscribers_on_topics_that_mirror_the_subjects(
    mqtt_server: EmbeddedNatsServer,
) -> None:
    subject = cloudevents.subject(CAM, "alerts")
    assert subject == f"vidsentry.{CAM}.alerts"
    with MqttWatcher(mqtt_port(mqtt_server), ["vidsentry/+/alerts"]) as hub:
        await hub.ready()
        nc = await nats.connect(mqtt_server.url)
        try:
            await nc.publish(subject, b'{"event":"start"}', headers={"ce-id": "1"})
            await nc.flush()
        finally:
            await nc.close()
        message = await hub.wait_for(f"vidsentry/{CAM}/alerts", b'{"event":"start"}')
        assert not message.retain  # live only: the hub's present is in the states above


async def test_bounds_refuse_and_count() -> None:
    retained = RetainedTopics(MqttTarget("127.0.0.1", 1), client_id="x", node_topic="n/a", max_topics=2,
                              max_payload=4, max_pending=3)
    assert retained.set("a/b", b"1") and retained.set("a/c", b"2")
    assert not retained.set("a/d", b"3") and retained.stats.refused_topics == 1
    assert not retained.set("a/b", b"12345") and retained.stats.refused_payloads == 1
    assert retained.get("a/b") == b"1"
    for value in (b"3", b"4", b"5"):  # nothing is sent (no broker): past 3 waiting, each topic's newest
        retained.set("a/b", value)
    assert retained.stats.coalesced > 0 and len(retained._pending) <= 3
    assert dict(retained._pending) == {"a/b": b"5", "a/c": b"2"}


def test_names_become_topic_levels_that_map_to_subjects_unchanged() -> None:
    assert slug("person") == "person" and slug("east-side_2") == "east-side_2"
    assert slug("traffic light").startswith("traffic_light_") and slug("traffic light") != slug("traffic_light")
    assert slug("edge.example.com").startswith("edge_example_com_")
    for name in ("traffic light", "a.b", "x/y", "#", "+", "é", ""):
        check_topic(f"p/{slug(name)}")
    for bad in ("a b", "a.b", "a//b", "a/#", "a/+", "/a", ""):
        with pytest.raises(MqttSettingsError):
            check_topic(bad)


def test_counted_classes_default_to_those_the_rules_name() -> None:
    class Rule:
        def __init__(self, id: str, type: str, classes: tuple[str, ...] | None = None) -> None:
            self.id, self.type, self.classes = id, type, classes

    rules = [Rule("r1", "zone", ("person", "car")), Rule("r2", "line", ("car",)), Rule("r3", "vlm")]
    entities = entities_of(rules, None)
    assert entities.count_classes == ("person", "car")
    assert [r.rule_id for r in entities.rules] == ["r1", "r2", "r3"]
    assert entities_of([Rule("r3", "vlm")], None, ["Normal", "Fall"]).count_classes == ("Normal", "Fall")
    assert entities_of([Rule("r3", "vlm")], None, [str(i) for i in range(80)]).count_classes == ()
    assert entities_of(rules, ["dog"], ["Normal"]).count_classes == ("dog",)
