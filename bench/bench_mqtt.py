"""Alert start → Home Assistant's state topic, live: how long after an alert goes out on NATS a hub
sees it over MQTT.

    python bench/bench_mqtt.py [--duration 60] [--captions]

The condition users run: `vidsentry serve` (a real process, default model) with the embedded
nats-server's MQTT listener and Home Assistant on (docs/mqtt.md), reading the sample clip as a
live camera with the sample's rules (a zone, a line; people enter, leave and cross all along).
Captions are off unless `--captions` (they do not touch this path, only load the machine). Two
clients stamp arrivals on the wall clock of this machine (the service's too): a NATS subscriber on
`vidsentry.*.alerts` and an MQTT 3.1.1 client (paho-mqtt, as Home Assistant subscribes) on the
rules' state and attributes topics. Every latency starts at the start event's `published_at` (ms
precision): to its arrival on NATS (for comparison), to the arrival of the attributes that name it,
and, where it turned its rule on, to the arrival of `ON` (the bridge sets a rule's attributes just
before its state). The MQTT side includes the service's fan-out to its taps, the bridge, paho's
thread, and nats-server's MQTT side (stored in JetStream: QoS 1, retained). Starts for which no
attributes naming them arrived (the end of the run cuts some off) are counted as unmatched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import nats
import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import ensure_sample, pct, table, write_results  # noqa: E402

from realtime.bus.cloudevents import parse_rfc3339  # noqa: E402
from realtime.bus.embedded import free_port  # noqa: E402
from tests.support.serve_process import ServeProcess  # noqa: E402

EMBEDDED_LINE = "vidsentry: embedded NATS at "


class Hub:
    """An MQTT client stamping every message on the rules' topics as it arrives (wall clock)."""

    def __init__(self, port: int) -> None:
        self.received: list[tuple[float, str, bytes]] = []
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id="bench-hub", protocol=paho.MQTTv311)
        self.client.on_connect = lambda c, *_: c.subscribe([("vidsentry-ha/stream/+/rule/#", 1)])
        self.client.on_subscribe = lambda *_: self.ready.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, _c: Any, _u: Any, message: paho.MQTTMessage) -> None:
        now = time.time()
        with self._lock:
            self.received.append((now, message.topic, bytes(message.payload)))

    def stop(self) -> list[tuple[float, str, bytes]]:
        self.client.disconnect()
        self.client.loop_stop()
        with self._lock:
            return list(self.received)


def published_at(body: dict[str, Any]) -> float:
    return parse_rfc3339(body["published_at"]).timestamp()


async def run(duration_s: float, captions: bool, workdir: Path) -> dict[str, Any]:
    sample = yaml.safe_load((ROOT / "samples" / "vidsentry.yaml").read_text())
    stream = sample["streams"][0]
    stream.update(url=str(ensure_sample()), audio=captions)
    mqtt_port = free_port()
    config = {"nats": {"mqtt_port": mqtt_port}, "homeassistant": {"enabled": True},
              "captions": {"enabled": captions}, "streams": [stream]}
    path = workdir / "vidsentry.yaml"
    path.write_text(yaml.safe_dump(config))
    serve = ServeProcess("--config", str(path), "--port", "0", log_dir=workdir)
    starts: dict[str, tuple[float, float]] = {}  # alert id -> (published_at, arrival on NATS)
    with serve.start(within_s=120):
        nats_url = next(line.split(EMBEDDED_LINE, 1)[1].split()[0]
                        for line in serve.stderr().splitlines() if EMBEDDED_LINE in line)
        hub = Hub(mqtt_port)
        if not await asyncio.to_thread(hub.ready.wait, 30.0):
            raise SystemExit("the MQTT hub was not subscribed within 30 s")
        nc = await nats.connect(nats_url)

        async def on_alert(msg: Any) -> None:
            body = json.loads(msg.data)
            if body.get("event") == "start":
                starts[body["alert_id"]] = (published_at(body), time.time())

        await nc.subscribe("vidsentry.*.alerts", cb=on_alert)
        await asyncio.sleep(duration_s)
        await nc.close()
        received = hub.stop()
        serve.terminate()

    to_nats = [(arrived - sent) * 1000 for sent, arrived in starts.values()]
    to_attributes: list[float] = []
    to_on: list[float] = []
    attributes_of: dict[str, str] = {}  # rule's state topic -> the alert its newest attributes named
    seen: set[str] = set()
    for arrival, topic, payload in received:
        if topic.endswith("/attributes"):
            body = json.loads(payload)
            alert_id = (body.get("alert") or {}).get("alert_id")
            if body.get("last_event") == "start" and alert_id in starts and alert_id not in seen:
                seen.add(alert_id)
                to_attributes.append((arrival - starts[alert_id][0]) * 1000)
                attributes_of[topic.removesuffix("/attributes")] = alert_id
        elif payload == b"ON" and topic in attributes_of:
            to_on.append((arrival - starts[attributes_of.pop(topic)][0]) * 1000)

    def summary(values: list[float]) -> dict[str, Any]:
        return {"p50": pct(values, 50), "p95": pct(values, 95), "n": len(values)}

    return {"duration_s": duration_s, "captions": captions, "alert_starts": len(starts),
            "unmatched": len(starts) - len(seen), "published_to_nats_ms": summary(to_nats),
            "published_to_attributes_ms": summary(to_attributes), "published_to_on_ms": summary(to_on)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of live alerts measured")
    parser.add_argument("--captions", action="store_true", help="captions on too (all stages but a VLM)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mqtt-") as tmp:
        result = asyncio.run(run(args.duration, args.captions, Path(tmp)))
    rows = [{"path": "alert start published -> NATS subscriber", **result["published_to_nats_ms"]},
            {"path": "alert start published -> HA attributes (MQTT)", **result["published_to_attributes_ms"]},
            {"path": "alert start published -> HA state ON (MQTT)", **result["published_to_on_ms"]}]
    print(table(rows, ["path", "p50", "p95", "n"]))
    print(f"alert starts: {result['alert_starts']}, without attributes naming them: {result['unmatched']}")
    print(write_results("mqtt", result))


if __name__ == "__main__":
    main()
