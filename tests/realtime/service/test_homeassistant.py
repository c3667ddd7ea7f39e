"""Home Assistant in `serve` (realtime.service.plugins.homeassistant): the config turns on the
embedded server's MQTT listener and the bridge, a hub (paho-mqtt) finds the stream as a device
with live states, and a stop leaves its entities unavailable rather than gone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from realtime.bus.embedded import free_port
from realtime.config import Config
from realtime.service.plugins.homeassistant import mqtt_target
from tests.support.mqtt import MqttWatcher
from tests.support.serve_process import ServeProcess, http, write_config
from tests.support.waiting import wait_until

RULES = [
    {"id": "east-side", "type": "zone", "polygon": [[580, 140], [768, 140], [768, 420], [580, 420]],
     "events": ["enter", "exit"]},
    {"id": "crossing", "type": "line", "points": [[600, 140], [600, 420]], "direction": "any"},
]


def config_with(**nats: Any) -> Config:
    return Config.model_validate({"nats": {"mqtt_port": 1883, **nats}, "homeassistant": {"enabled": True}})


def test_the_bridge_reaches_the_mqtt_listener_of_the_nats_server_it_publishes_to() -> None:
    assert mqtt_target(config_with(), "nats://127.0.0.1:4222").host == "127.0.0.1"
    assert mqtt_target(config_with(), "nats://bus.lan:4222,nats://bus2.lan:4222").host == "bus.lan"
    # The embedded server is reached on loopback, its listener maybe on one LAN address only.
    login = {"mqtt_username": "hub", "mqtt_password": "secret"}
    target = mqtt_target(config_with(mqtt_host="192.168.1.20", **login), "nats://127.0.0.1:4222")
    assert (target.host, target.port, target.username, target.password) == ("192.168.1.20", 1883, "hub", "secret")
    assert mqtt_target(config_with(mqtt_host="0.0.0.0", **login), "nats://127.0.0.1:4222").host == "127.0.0.1"


@pytest.mark.parametrize(("settings", "problem"), [
    ({"homeassistant": {"enabled": True}}, "homeassistant.enabled needs nats.mqtt_port"),
    ({"nats": {"mqtt_port": 1883, "mqtt_host": "0.0.0.0"}}, "needs mqtt_username and mqtt_password"),
    ({"nats": {"mqtt_port": 1883, "mqtt_username": "hub"}}, "set both or neither"),
])
def test_settings_that_cannot_work_are_refused_naming_why(settings: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Config.model_validate(settings)
    # Off loopback with a login is fine, and so is an external server's listener anywhere.
    Config.model_validate({"nats": {"mqtt_port": 1883, "mqtt_host": "0.0.0.0", "mqtt_username": "hub",
                                    "mqtt_password": "secret"}})
    Config.model_validate({"nats": {"url": "nats://bus.lan:4222", "mqtt_port": 1883, "mqtt_host": "0.0.0.0"}})


async def test_serve_makes_each_stream_a_device_with_live_states_and_leaves_it_unavailable_on_stop(
    tmp_path: Path, sample_clip: Path
) -> None:
    port = free_port()
    config = write_config(tmp_path / "vidsentry.yaml", {
        "node": "edge.example.com",  # a node name with dots: its topic level is made to fit
        "nats": {"mqtt_port": port},
        "homeassistant": {"enabled": True},
        "captions": {"enabled": False},
        "streams": [{"id": "plaza", "url": str(sample_clip), "audio": False, "rules": RULES}],
    })
    serve = ServeProcess("--config", str(config), "--port", "0", log_dir=tmp_path)
    with await asyncio.to_thread(serve.start):
        assert f"vidsentry: MQTT at mqtt://127.0.0.1:{port}" in serve.stderr()
        with MqttWatcher(port, ["homeassistant/#", "vidsentry-ha/#"]) as hub:
            await hub.ready()
            configs = {f"homeassistant/binary_sensor/vidsentry_plaza/{r}/config" for r in ("east-side", "crossing")}
            configs |= {f"homeassistant/sensor/vidsentry_plaza/count_{c}/config" for c in ("Normal", "Fall")}
            configs.add("homeassistant/image/vidsentry_plaza/snapshot/config")
            await wait_until(lambda: configs <= set(hub.matching("homeassistant/")), 60.0,
                             lambda: f"discovery configs, got {sorted(hub.matching('homeassistant/'))}")
            await hub.wait_for("vidsentry-ha/stream/plaza/availability", b"online", within_s=60.0)
            # nats-server may not hand a retained message to a subscriber of its first moments: a hub
            # then announces itself (its birth message), and the service sends its states again.
            hub.publish("homeassistant/status", b"online")
            await wait_until(lambda: hub.matching("vidsentry-ha/node/edge_example_com_"), 30.0, "the node's status")
            nodes = [t for t in hub.matching("vidsentry-ha/node/edge_example_com_")]
            assert len(nodes) == 1 and hub.payload(nodes[0]) == b"online"
            # People walk through the sample: the count follows its tracks.
            await wait_until(lambda: int(hub.payload("vidsentry-ha/stream/plaza/count/Normal") or b"0") >= 1, 60.0,
                             "tracked people counted")
            rule = json.loads(hub.payload("homeassistant/binary_sensor/vidsentry_plaza/crossing/config") or b"")
            assert rule["availability"][0]["topic"] == nodes[0]

            metrics = (await asyncio.to_thread(http, "GET", f"{serve.url}/metrics"))[1]
            assert "vidsentry_mqtt_connected 1.0" in metrics and "vidsentry_mqtt_published_total" in metrics

            assert await asyncio.to_thread(serve.terminate) == 0, serve.stderr()
            await hub.wait_for(nodes[0], b"offline")
            await hub.wait_for("vidsentry-ha/stream/plaza/availability", b"offline")
            # Stopped, not deleted: its entities stay (no empty config came after them).
            assert all(hub.payload(topic) for topic in configs)
