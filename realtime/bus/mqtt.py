"""Retained state over MQTT: a mirror of topics and their latest payloads, kept on a broker.

NATS has no retained messages: a NATS publish reaches MQTT subscribers only as a live QoS 0
message, and nothing stores it for the next subscriber. nats-server's MQTT listener keeps
retained messages (in JetStream) only for what MQTT clients publish with the retain flag. So
whatever a hub must find when it (re)subscribes, Home Assistant's discovery configs and states,
is published here as an MQTT client (paho-mqtt, MQTT 3.1.1, QoS 1, retained).

`RetainedTopics` holds the wanted payload of every topic (`set`, `clear`), bounded in topics and
in payload bytes (refusals counted). Every change is sent in order, so a state on for an instant is
seen on; past `max_pending` waiting messages only each topic's newest is kept (counted), and at
most `window` messages are unacknowledged at once. After every (re)connect the whole mirror is
sent again: a broker that lost its store (or a retained message lost in a disconnect) is put
right; so, too, after a hub says it is online on its birth topic (`resend_on`). `node_topic` is
`online` while connected and `offline` after a clean close; the same `offline` is the
connection's will, which the broker publishes if this process dies.

paho runs its network loop on a thread of its own; its callbacks only hand news to the event loop
(`call_soon_threadsafe`), where everything else happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from pipelines.tasks import wait_set
from realtime.errors import ServiceError

log = logging.getLogger(__name__)

ONLINE = b"online"
OFFLINE = b"offline"
DEFAULT_MAX_TOPICS = 20_000
DEFAULT_MAX_PAYLOAD = 900 * 1024  # under nats-server's default max_payload (1 MiB) with room for the header
DEFAULT_WINDOW = 64
DEFAULT_MAX_PENDING = 10_000  # messages waiting to be sent; past it only each topic's newest stays
_KEEPALIVE_S = 30
_RECONNECT_MIN_S = 1
_RECONNECT_MAX_S = 10


class MqttSettingsError(ServiceError, ValueError):
    """An MQTT URL or topic that cannot be used."""


@dataclass(frozen=True, slots=True)
class MqttTarget:
    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def parse_mqtt_url(url: str) -> tuple[str, int]:
    """(host, port) of `mqtt://host:port` (1883 by default)."""
    parts = urlsplit(url)
    if parts.scheme != "mqtt" or not parts.hostname:
        raise MqttSettingsError("an MQTT URL is mqtt://host[:port]")
    return parts.hostname, parts.port or 1883


def check_topic(topic: str) -> str:
    """A topic name nats-server maps to a NATS subject and back unchanged: levels of letters,
    digits, `_` and `-` (no wildcards, no spaces, no empty level, no `.`)."""
    levels = topic.split("/")
    if not topic or any(not level or not all(c.isascii() and (c.isalnum() or c in "_-") for c in level)
                        for level in levels):
        raise MqttSettingsError(f"topic {topic!r}: use levels of A-Z a-z 0-9 _ - separated by /")
    return topic


@dataclass
class RetainedStats:
    published: int = 0  # messages the broker acknowledged
    refused_topics: int = 0  # `set` of a new topic past max_topics
    refused_payloads: int = 0  # `set` of a payload larger than max_payload
    connects: int = 0
    disconnects: int = 0
    resends: int = 0  # the whole mirror sent again because a hub came online
    coalesced: int = 0  # changes dropped for a newer one of their topic (past max_pending)


class RetainedTopics:
    """A bounded mirror of retained topics, kept on an MQTT broker (see the module docstring)."""

    def __init__(
        self,
        target: MqttTarget,
        *,
        client_id: str,
        node_topic: str,
        max_topics: int = DEFAULT_MAX_TOPICS,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        window: int = DEFAULT_WINDOW,
        max_pending: int = DEFAULT_MAX_PENDING,
        resend_on: str | None = None,
    ) -> None:
        self.target = target
        self.node_topic = check_topic(node_topic)
        # A hub's birth topic: its `online` (it has just subscribed) has everything sent again.
        self.resend_on = None if resend_on is None else check_topic(resend_on)
        self.max_topics = max_topics
        self.max_payload = max_payload
        self.window = window
        self.max_pending = max_pending
        self.stats = RetainedStats()
        self._mirror: dict[str, bytes] = {}  # what the broker should hold, by topic
        # What to send, in order (b"": delete). Every change goes, so a state that is on for an
        # instant (an alert that starts and ends at once) is seen on; past max_pending, only the
        # newest of each topic is kept (counted).
        self._pending: deque[tuple[str, bytes]] = deque()
        self._inflight: dict[int, tuple[str, bytes]] = {}  # sent, not acknowledged, by message id
        self._connected = False
        self._changed = asyncio.Event()  # pending, a connect or an ack: the sender looks again
        self._idle = asyncio.Event()  # nothing pending or in flight
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                   protocol=paho.MQTTv311, clean_session=True)
        if target.username is not None:
            self._client.username_pw_set(target.username, target.password)
        self._client.will_set(self.node_topic, OFFLINE, qos=1, retain=True)
        self._client.reconnect_delay_set(_RECONNECT_MIN_S, _RECONNECT_MAX_S)
        self._client.max_inflight_messages_set(window)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_publish = self._on_publish
        self._client.on_message = self._on_message
        self._client.on_connect_fail = self._on_connect_fail
        self._failing = False  # a failed connect was logged; the next is not, until one succeeds

    # -- what the broker should hold ----------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected

    def get(self, topic: str) -> bytes | None:
        return self._mirror.get(topic)

    def topics(self) -> list[str]:
        return list(self._mirror)

    def set(self, topic: str, payload: bytes) -> bool:
        """Keep `payload` retained on `topic`; False when refused by a bound (counted)."""
        if self._mirror.get(topic) == payload:
            return True
        if len(payload) > self.max_payload:
            self.stats.refused_payloads += 1
            return False
        if topic not in self._mirror and len(self._mirror) >= self.max_topics:
            self.stats.refused_topics += 1
            return False
        self._mirror[topic] = payload
        self._queue(topic, payload)
        return True

    def clear(self, topic: str) -> None:
        """Delete the retained message of `topic` (an empty retained publish)."""
        if self._mirror.pop(topic, None) is not None:
            self._queue(topic, b"")

    def _queue(self, topic: str, payload: bytes) -> None:
        if len(self._pending) >= self.max_pending:
            newest = dict(self._pending)
            self.stats.coalesced += len(self._pending) - len(newest)
            self._pending = deque(newest.items())
        self._pending.append((topic, payload))
        self._idle.clear()
        self._changed.set()

    # -- running ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect (and reconnect, in paho's loop) and send until cancelled; a cancel first
        flushes for a moment and marks the node offline (close)."""
        self._loop = asyncio.get_running_loop()
        self._client.connect_async(self.target.host, self.target.port, keepalive=_KEEPALIVE_S)
        self._client.loop_start()
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                self._send()
        finally:
            await self._close()

    async def flushed(self, timeout_s: float) -> bool:
        """Wait until everything set so far is acknowledged; False after `timeout_s`."""
        return await wait_set(self._idle, timeout_s)

    def _send(self) -> None:
        if not self._connected:
            return
        while self._pending and len(self._inflight) < self.window:
            topic, payload = self._pending.popleft()
            info = self._client.publish(topic, payload, qos=1, retain=True)
            if info.rc != paho.MQTT_ERR_SUCCESS:  # the connection went: sent again after the connect
                self._pending.appendleft((topic, payload))
                return
            self._inflight[info.mid] = (topic, payload)
        self._update_idle()

    def _update_idle(self) -> None:
        if not self._pending and not self._inflight:
            self._idle.set()

    async def _close(self, timeout_s: float = 2.0) -> None:
        if self._connected:
            await self.flushed(timeout_s)
            info = self._client.publish(self.node_topic, OFFLINE, qos=1, retain=True)
            with contextlib.suppress(RuntimeError, ValueError):  # the connection went meanwhile: the will says it
                await asyncio.to_thread(info.wait_for_publish, timeout_s)
        self._client.disconnect()
        await asyncio.to_thread(self._client.loop_stop)
        self._connected = False

    # -- paho's thread ------------------------------------------------------------------------

    def _call(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    def _on_connect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if getattr(reason, "is_failure", False):
            self._call(log.warning, "MQTT connection refused: %s", str(reason))
            return
        if self.resend_on is not None:
            self._client.subscribe(self.resend_on, qos=0)
        self._call(self._connected_now)

    def _on_connect_fail(self, _client: Any, _userdata: Any) -> None:
        self._call(self._connect_failed)

    def _on_disconnect(self, _client: Any, _userdata: Any, _flags: Any, _reason: Any, _props: Any) -> None:
        self._call(self._disconnected_now)

    def _on_publish(self, _client: Any, _userdata: Any, mid: int, _reason: Any, _props: Any) -> None:
        self._call(self._acked, mid)

    def _on_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        if message.topic == self.resend_on and bytes(message.payload) == ONLINE:
            self._call(self._resend)

    # -- back on the event loop ---------------------------------------------------------------

    def _connect_failed(self) -> None:
        if not self._failing:
            self._failing = True
            log.warning("MQTT broker unreachable host=%s port=%s; retrying every %d s at most",
                        self.target.host, self.target.port, _RECONNECT_MAX_S)

    def _connected_now(self) -> None:
        self._failing = False
        self._connected = True
        self.stats.connects += 1
        log.info("MQTT connected host=%s port=%s topics=%d", self.target.host, self.target.port, len(self._mirror))
        # What was pending or in flight is sent again: the mirror whole, and the deletes not set since.
        deletes = dict.fromkeys(t for t, _ in [*self._inflight.values(), *self._pending] if t not in self._mirror)
        self._inflight.clear()
        self._pending = deque([(self.node_topic, ONLINE), *self._mirror.items(), *((t, b"") for t in deletes)])
        self._idle.clear()
        self._changed.set()

    def _resend(self) -> None:
        """Send the whole mirror again (a hub came online: a subscription made while a retained
        message was being stored can miss it)."""
        self.stats.resends += 1
        if self._connected:  # this node's availability too: every entity names it
            self._pending.append((self.node_topic, ONLINE))
        self._pending.extend(self._mirror.items())
        if self._pending:
            self._idle.clear()
            self._changed.set()

    def _disconnected_now(self) -> None:
        if self._connected:
            self.stats.disconnects += 1
            log.warning("MQTT disconnected host=%s port=%s", self.target.host, self.target.port)
        self._connected = False

    def _acked(self, mid: int) -> None:
        if self._inflight.pop(mid, None) is not None:
            self.stats.published += 1
        self._update_idle()
        self._changed.set()
