"""Alert start → Home Assistant's state topic, live: how long after an alert goes out on NATS a hub
sees it over MQTT.

    python bench/bench_mqtt.py [--duration 60] [--captions]

The condition users run: `vidsentry serve` (a real process, default model) with the embedded
nats-server's MQTT listener and Home Assistant on (docs/mqtt.md), reading the sample clip as a
live camera with the sample's rules (a zone, a line; people enter, leave and cross all along).
Captions are off unless `--captions` (they do not touch this path, only load the machine). Two
clients stamp arrivals on this process's monotonic clock: a NATS subscriber on
`vidsentry.*.alerts` and an MQTT 3.1.1 client (paho-mqtt, as Home Assistant subscribes) on the
rules' state and attributes topics. For each alert start, the latency is the arrival of the
attributes that name it minus the arrival of the event on NATS; for each rule turning on, the
arrival of `ON` minus that of the start that turned it on. Both include the service's fan-out
to its taps, the bridge, paho's thread, and nats-server's MQTT side (stored in JetStream: QoS 1,
retained). Starts for which no attributes naming them arrived (the end of the run cuts some off)
are counted as unmatched, not measured.
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

from realtime.bus.embedded import free_port  # noqa: E402
from tests.support.serve_process import ServeProcess  # noqa: E402

EMBEDDED_LINE = "vidsentry: embedded NATS at "


class Hub:
    """An MQTT client stamping every message on the rules' topics as it arrives."""

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
        now = time.monotonic()
        with self._lock:
            self.received.append((now, message.topic, bytes(message.payload)))

    def stop(self) -> list[tuple[float, str, bytes]]:
        self.client.disconnect()
        self.client.loop_stop()
        with self._lock:
            return list(self.received)


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
    starts: dict[str, tuple[float, str, str]] = {}  # alert id -> (arrival, stream, rule)
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
                starts[body["alert_id"]] = (time.monotonic(), body["stream_id"], body["rule_id"])

        await nc.subscribe("vidsentry.*.alerts", cb=on_alert)
        await asyncio.sleep(duration_s)
        await nc.close()
        received = hub.stop()
        serve.terminate()

    per_start: list[float] = []
    unmatched = 0
    for alert_id, (sent, stream_id, rule_id) in starts.items():
        topic = f"vidsentry-ha/stream/{stream_id}/rule/{rule_id}/attributes"
        seen = [t for t, top, payload in received if top == topic and t >= sent
                and (json.loads(payload).get("alert") or {}).get("alert_id") == alert_id]
        if seen:
            per_start.append((seen[0] - sent) * 1000)
        else:
            unmatched += 1
    turned_on: list[float] = []
    for arrival, topic, payload in received:
        if payload != b"ON" or topic.endswith("/attributes"):
            continue
        rule_id = topic.rsplit("/", 1)[1]
        before = [sent for sent, _, rule in starts.values() if rule == rule_id and sent <= arrival]
        if before:
            turned_on.append((arrival - max(before)) * 1000)
    return {"duration_s": duration_s, "captions": captions, "alert_starts": len(starts), "unmatched": unmatched,
            "start_to_attributes_ms": {"p50": pct(per_start, 50), "p95": pct(per_start, 95), "n": len(per_start)},
            "start_to_on_ms": {"p50": pct(turned_on, 50), "p95": pct(turned_on, 95), "n": len(turned_on)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of live alerts measured")
    parser.add_argument("--captions", action="store_true", help="captions on too (all stages but a VLM)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mqtt-") as tmp:
        result = asyncio.run(run(args.duration, args.captions, Path(tmp)))
    rows = [{"path": "alert start (NATS) -> HA attributes", **result["start_to_attributes_ms"]},
            {"path": "alert start (NATS) -> HA state ON", **result["start_to_on_ms"]}]
    print(table(rows, ["path", "p50", "p95", "n"]))
    print(f"alert starts: {result['alert_starts']}, without attributes naming them: {result['unmatched']}")
    print(write_results("mqtt", result))


if __name__ == "__main__":
    main()
