"""A real MQTT client for tests (paho-mqtt, MQTT 3.1.1), standing in for a hub such as Home
Assistant, and an embedded nats-server with its MQTT listener on.

`MqttWatcher` subscribes and records every message by topic (payload and retain flag) from
paho's network thread; tests wait on what it holds (tests.support.waiting), never sleep.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from realtime.bus.embedded import EmbeddedNatsServer, MqttListener, NatsServerError, free_port
from tests.support.waiting import wait_until


@dataclass(frozen=True, slots=True)
class Received:
    topic: str
    payload: bytes
    retain: bool


class MqttWatcher:
    def __init__(self, port: int, topics: list[str], *, host: str = "127.0.0.1", client_id: str = "hub",
                 username: str | None = None, password: str | None = None) -> None:
        self.port, self.host, self.topics = port, host, topics
        self.messages: list[Received] = []
        self.refused: str | None = None  # the CONNACK's reason when the broker refused us
        self.subscribed = threading.Event()
        self._lock = threading.Lock()
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv311)
        if username is not None:
            self._client.username_pw_set(username, password)
        self._client.on_connect = self._on_connect
        self._client.on_message = self._on_message
        self._client.on_subscribe = lambda *_: self.subscribed.set()

    def _on_connect(self, client: paho.Client, _u: object, _f: object, reason: paho.ReasonCode, _p: object) -> None:
        if reason.is_failure:
            self.refused = str(reason)
            return
        client.subscribe([(topic, 1) for topic in self.topics])

    def _on_message(self, _c: paho.Client, _u: object, message: paho.MQTTMessage) -> None:
        with self._lock:
            self.messages.append(Received(message.topic, bytes(message.payload), bool(message.retain)))

    def start(self) -> MqttWatcher:
        self._client.connect_async(self.host, self.port, keepalive=10)
        self._client.loop_start()
        return self

    def stop(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def __enter__(self) -> MqttWatcher:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    async def ready(self, within_s: float = 10.0) -> MqttWatcher:
        """Subscribed (the broker's SUBACK came): what is published from now on reaches it live."""
        await wait_until(self.subscribed.is_set, within_s, lambda: f"a SUBACK (refused: {self.refused})")
        return self

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self._client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10.0)

    def latest(self, topic: str) -> Received | None:
        with self._lock:
            return next((m for m in reversed(self.messages) if m.topic == topic), None)

    def payload(self, topic: str) -> bytes | None:
        message = self.latest(topic)
        return None if message is None else message.payload

    def matching(self, prefix: str) -> dict[str, Received]:
        with self._lock:
            return {m.topic: m for m in self.messages if m.topic.startswith(prefix)}

    async def wait_for(self, topic: str, payload: bytes, within_s: float = 10.0) -> Received:
        await wait_until(lambda: self.payload(topic) == payload, within_s,
                         lambda: f"{topic} = {payload!r}, got {self.payload(topic)!r}")
        message = self.latest(topic)
        assert message is not None
        return message


MQTT_PORT_TRIES = 5


def started_mqtt_nats_server(store_dir: Path, *, config_file: Path | None = None, **login: str) -> EmbeddedNatsServer:
    """A started nats-server with an MQTT listener on a free port. EmbeddedNatsServer picks its
    NATS port again when another process takes it first, but not an MQTT port it was given
    (clients must find that one again after a restart): one taken between free_port() and the
    bind (another test worker's) is tried here again with another."""
    for attempt in range(1, MQTT_PORT_TRIES + 1):
        server = EmbeddedNatsServer(store_dir=store_dir, config_file=config_file,
                                    mqtt=MqttListener(free_port(), **login))
        try:
            return server.start()
        except NatsServerError as exc:
            server.stop()
            if "already in use" not in str(exc) or attempt == MQTT_PORT_TRIES:
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def mqtt_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    """A fresh nats-server with JetStream and an MQTT listener on loopback, its store kept for restarts."""
    server = started_mqtt_nats_server(tmp_path / "nats-store")
    try:
        yield server
    finally:
        server.stop()


def mqtt_port(server: EmbeddedNatsServer) -> int:
    assert server.mqtt is not None
    return server.mqtt.port
