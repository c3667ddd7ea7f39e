"""WHIP ingest: the time from a client's `POST /whip/{stream}` to the stream's first `detections`
event on NATS, live.

The real service runs in this process (embedded nats-server, the default people detector on
ONNX Runtime CPU, warmed up first) and each run publishes one new session, then ends it with
a DELETE and waits until it is gone. Two clients:

  aiortc          an in-process aiortc peer standing in for a browser (tests/support/peer.py):
                  640x480 vtest frames pre-encoded as VP8 at 15 fps, every candidate in the
                  offer (non-trickle), as the page sends it.
  whip-client     Meetecho's simple-whip-client (Debian package), a separate process: a
                  GStreamer test pattern as VP8 at 15 fps, trickling its candidates over PATCH
                  (tests/support/whip_client.py). Skipped when it is not installed.

The clock starts when the service receives the POST (stamped in the route, so both clients are
timed alike) and stops when the `detections` event reaches a NATS subscriber in this process.
The parts between: POST -> 201 (negotiation: aiortc gathers its candidates), then ICE and DTLS,
the first decoded frame, and the first detection. For whip-client the time from starting its
process is shown too (GStreamer's own start-up). The machine may be shared: loadavg before and
after is printed with the figures.

Usage: python bench/bench_whip.py [--runs 5] [--clients aiortc,whip-client]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats
from _common import ROOT, pct, table, write_results
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from engines.detector import Detector
from tests.support.peer import EncodedLoopVideoTrack, encode_vp8, load_frames, send_vp8_only
from tests.support.service import LiveService, live_service, make_config
from tests.support.whip_client import CLIENT, TEST_PATTERN, build_shim, publishing

FPS = 15.0
SIZE = (640, 480)
FIRST_DETECTION_WITHIN_S = 30.0
POSTS: dict[str, float] = {}  # stream id -> monotonic time the service received its POST


def stamp_posts() -> None:
    """Wrap the WHIP route before the service builds its app: the clock starts at the server."""
    from realtime.http import whip

    publish = whip.publish

    async def stamped(request: Any) -> Any:
        POSTS[request.match_info["stream"]] = time.monotonic()
        return await publish(request)

    whip.publish = stamped  # type: ignore[assignment]


class FirstDetections:
    """The monotonic time each stream's first `detections` event reached this subscriber."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.nc: Any = None

    async def start(self, url: str) -> None:
        self.nc = await nats.connect(url)

        async def on_message(msg: Any) -> None:
            stream_id = msg.subject.split(".")[1]
            self.at.setdefault(stream_id, time.monotonic())

        await self.nc.subscribe("vidsentry.*.detections", cb=on_message)

    async def wait(self, stream_id: str) -> float:
        deadline = time.monotonic() + FIRST_DETECTION_WITHIN_S
        while stream_id not in self.at:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no detections from {stream_id} within {FIRST_DETECTION_WITHIN_S:g} s")
            await asyncio.sleep(0.005)
        return self.at[stream_id]


async def gone(svc: LiveService, stream_id: str) -> None:
    deadline = time.monotonic() + 15
    while stream_id in svc.service.sessions or (await svc.call("GET", f"/api/streams/{stream_id}")).status != 404:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{stream_id} still there 15 s after its DELETE")
        await asyncio.sleep(0.05)


async def run_aiortc(svc: LiveService, first: FirstDetections, payloads: list[bytes], stream_id: str) -> dict[str, Any]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    connected_event = asyncio.Event()
    pc.on("connectionstatechange", lambda: pc.connectionState == "connected" and connected_event.set())
    track = EncodedLoopVideoTrack(payloads, FPS)
    pc.addTrack(track)
    send_vp8_only(pc, track)
    try:
        await pc.setLocalDescription(await pc.createOffer())
        headers = {"Content-Type": "application/sdp"}
        async with svc.session.post(f"{svc.url}/whip/{stream_id}", data=pc.localDescription.sdp,
                                    headers=headers) as response:
            answered = time.monotonic()
            if response.status != 201:
                raise RuntimeError(f"POST refused: {response.status} {await response.text()}")
            location, answer = response.headers["Location"], await response.text()
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await asyncio.wait_for(connected_event.wait(), FIRST_DETECTION_WITHIN_S)
        connected = time.monotonic()
        detected = await first.wait(stream_id)
        posted = POSTS[stream_id]
        async with svc.session.delete(svc.url + location) as response:
            assert response.status == 200, response.status
        await gone(svc, stream_id)
    finally:
        await pc.close()
    return {
        "client": "aiortc",
        "post_to_201_ms": round((answered - posted) * 1000, 1),
        "post_to_connected_ms": round((connected - posted) * 1000, 1),
        "post_to_first_detection_ms": round((detected - posted) * 1000, 1),
    }


async def run_whip_client(svc: LiveService, first: FirstDetections, shim: Path, stream_id: str,
                          log: Path) -> dict[str, Any]:
    started = time.monotonic()
    async with publishing(f"{svc.url}/whip/{stream_id}", video=TEST_PATTERN, audio=None, shim=shim, log=log):
        detected = await first.wait(stream_id)
    await gone(svc, stream_id)  # SIGTERM: the client DELETEs its resource
    posted = POSTS[stream_id]
    return {
        "client": "whip-client",
        "start_to_post_ms": round((posted - started) * 1000, 1),
        "post_to_first_detection_ms": round((detected - posted) * 1000, 1),
        "start_to_first_detection_ms": round((detected - started) * 1000, 1),
    }


@contextlib.asynccontextmanager
async def service(detector: Detector, nats_url: str) -> AsyncIterator[LiveService]:
    config = make_config(node="bench", webrtc={"inactivity_timeout_s": 10.0})
    async with live_service(detector, nats_url, config=config) as svc:
        yield svc


def summary(rows: list[dict[str, Any]], client: str) -> dict[str, Any]:
    mine = [r for r in rows if r["client"] == client]
    out: dict[str, Any] = {"client": client, "runs": len(mine)}
    for key in mine[0] if mine else []:
        if key.endswith("_ms"):
            values = [r[key] for r in mine]
            out[f"{key[:-3]}_p50_ms"] = pct(values, 50)
            out[f"{key[:-3]}_max_ms"] = max(values)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from engines.models import default_detector_model
    from engines.registry import create_detector
    from realtime.bus.embedded import EmbeddedNatsServer

    stamp_posts()
    frames = load_frames(ROOT / ".cache" / "samples" / "vtest.avi", count=30, size=SIZE)
    payloads = encode_vp8(frames, FPS)
    clients = [c for c in args.clients.split(",") if c]
    if "whip-client" in clients and shutil.which(CLIENT) is None:
        print(f"{CLIENT} is not installed (deploy/setup.sh): skipping it", flush=True)
        clients.remove("whip-client")
    detector = create_detector(default_detector_model(), "onnx-cpu")
    detector.detect([frames[0]])  # warm: the first inference builds ONNX Runtime's kernels
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"fps": FPS, "size": list(SIZE), "model": default_detector_model().name,
                              "loadavg_before": os.getloadavg()}
    try:
        with tempfile.TemporaryDirectory() as tmp, EmbeddedNatsServer(store_dir=Path(tmp) / "nats") as server:
            shim = build_shim(Path(tmp)) if "whip-client" in clients else None
            first = FirstDetections()
            await first.start(server.url)
            async with service(detector, server.url) as svc:
                for client in clients:
                    for index in range(args.runs):
                        stream_id = f"whip-{client.replace('-', '')}-{index}"
                        if client == "aiortc":
                            row = await run_aiortc(svc, first, payloads, stream_id)
                        else:
                            assert shim is not None
                            row = await run_whip_client(svc, first, shim, stream_id, Path(tmp) / f"{stream_id}.log")
                        print(json.dumps(row), flush=True)
                        rows.append(row)
            await first.nc.close()
    finally:
        detector.close()
    result["runs"] = rows
    result["summary"] = [summary(rows, client) for client in clients]
    result["loadavg_after"] = os.getloadavg()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clients", default="aiortc,whip-client")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    for row in result["summary"]:
        print()
        print(table([row], list(row)))
    print(f"\nloadavg before {result['loadavg_before']}, after {result['loadavg_after']} (a shared machine)")
    print(f"written {write_results('whip', result)}")


if __name__ == "__main__":
    main()
