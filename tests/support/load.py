"""The soak's load, reusable: cameras, browser peers, readers and questions against one `serve`.

Every fault found before the soak was found by probing one thing at a time; a deployment has every
stream, capability and fault at once. This module is that mix, so `bench/soak.py` (the long run),
its short version in the tests and the chaos runs put the same load on the service:

    plan = LoadPlan(cameras=8, peers=4)
    with CameraRig(plan, work_dir) as rig:                      # RTSP servers (real GStreamer)
        config = serve_config(plan, rig, nats_url=..., vlm_url=..., work=work_dir)
        ... start `vidsentry serve` with it (tests/support/serve_process.py) ...
        load = Load(plan, rig, base_url, PeerMedia.build(plan))
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(load.run(stop))                   # until stop is set
            ...
        load.stats()                                             # counts of what the load did

The cameras (all with audio): half play a clip with speech (its H.264 + AAC as it is, looped to the
run's length so it never ends), one is a live test pattern on a server of its own that is killed
and started again every `flap_every_s` (a camera that drops and comes back), one switches its
picture size every `resize_every_s`, the rest are live test patterns with a tone. Peers are aiortc
connections sending pre-encoded VP8 (a browser encodes on its own machine) and Opus speech, each
coming and going; every camera has a server-sent-events reader, every peer reads its DataChannel;
a question goes to `POST /api/ask` every `ask_every_s`. Every count is bounded: readers keep
counts, not events.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from tests.support.peer import (
    EncodedLoopVideoTrack,
    LoopAudioTrack,
    encode_vp8,
    load_frames,
    load_speech,
    send_vp8_only,
)
from tests.support.rtsp import RtspServer

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / ".cache" / "samples"
QUESTION = "What did the people in view say, and where were they walking?"

# vtest's pedestrians cross the frame all the time: these fire every minute or so (the zone: the east side).
SPEECH_RULES: list[dict[str, Any]] = [
    {"id": "crowd", "type": "count", "classes": ["Normal"], "above": 3, "for_s": 2, "cooldown_s": 20},
    {"id": "east-side", "type": "zone", "polygon": [[480, 100], [768, 100], [768, 576], [480, 576]],
     "events": ["enter"], "cooldown_s": 20},
]


@dataclass(frozen=True)
class LoadPlan:
    cameras: int = 8
    peers: int = 4
    seconds: float = 1800.0  # how long the speech clip must play without ending
    flap_every_s: float = 180.0  # the flaky camera's server is killed this often ...
    flap_down_s: float = 15.0  # ... for this long
    resize_every_s: float = 60.0
    peer_on_s: tuple[float, float] = (60.0, 150.0)  # a peer stays between these ...
    peer_off_s: tuple[float, float] = (10.0, 30.0)  # ... and is away between these
    peer_fps: float = 10.0
    ask_every_s: float = 60.0
    seed: int = 7

    @property
    def speech_cameras(self) -> int:
        return max(1, self.cameras // 2)


def looped_clip(source: Path, seconds: float, into: Path) -> Path:
    """`source` (H.264 + audio) repeated until it lasts `seconds`, its packets copied as they are:
    a camera that talks for the whole run without costing an encode. The audio is padded with
    silence to the video's length first (AAC, encoded once), so every lap lines up."""
    with av.open(str(source)) as probe:
        video = probe.streams.video[0]
        lap = float(video.duration * video.time_base) if video.duration else probe.duration / 1e6
    laps = max(1, int(np.ceil(seconds / lap)))
    target = into / f"{source.stem}-x{laps}.mp4"
    if target.exists():
        return target
    into.mkdir(parents=True, exist_ok=True)
    rate = 16_000
    pcm: list[np.ndarray] = []
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
    with av.open(str(source)) as src:
        for frame in src.decode(audio=0):
            pcm += [out.to_ndarray().reshape(-1) for out in resampler.resample(frame)]
    samples = np.zeros(int(lap * rate), np.int16)
    speech = np.concatenate(pcm)[: len(samples)]
    samples[: len(speech)] = speech
    partial = target.with_suffix(".partial.mp4")
    with av.open(str(source)) as src, av.open(str(partial), "w") as dst:
        vin = src.streams.video[0]
        vout = dst.add_stream_from_template(vin)
        aout = dst.add_stream("aac", rate=rate, layout="mono")
        aout.bit_rate = 48_000
        audio_packets: list[tuple[int, int | None, bytes, bool]] = []
        step = 1024
        for begin in range(0, len(samples), step):
            chunk = samples[begin : begin + step]
            if len(chunk) < step:
                chunk = np.pad(chunk, (0, step - len(chunk)))
            frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = rate, begin, fractions.Fraction(1, rate)
            audio_packets += [(p.pts, p.dts, bytes(p), p.is_keyframe) for p in aout.encode(frame)]
        audio_packets += [(p.pts, p.dts, bytes(p), p.is_keyframe) for p in aout.encode(None)]
        video_packets = [p for p in src.demux(vin) if p.size > 0]
        video_lap = round(lap / vin.time_base)
        audio_lap = len(samples)
        for n in range(laps):
            # Interleave one second at a time so the muxer never holds a whole lap of one stream.
            a_index = 0
            for packet in video_packets:
                due = float(packet.pts * vin.time_base)
                while a_index < len(audio_packets) and audio_packets[a_index][0] / rate <= due:
                    pts, dts, data, key = audio_packets[a_index]
                    out = av.Packet(data)
                    out.stream = aout
                    out.time_base = fractions.Fraction(1, rate)
                    out.pts = pts + n * audio_lap
                    out.dts = (dts if dts is not None else pts) + n * audio_lap
                    out.is_keyframe = key
                    dst.mux(out)
                    a_index += 1
                copy = av.Packet(bytes(packet))
                copy.stream = vout
                copy.time_base = vin.time_base
                copy.pts = packet.pts + n * video_lap
                copy.dts = packet.dts + n * video_lap
                copy.is_keyframe = packet.is_keyframe
                dst.mux(copy)
    partial.rename(target)
    return target


@dataclass(frozen=True)
class Camera:
    id: str
    role: str  # speech | flaky | resize | tone
    url: str

    def config(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"id": self.id, "url": self.url, "audio": True}
        if self.role == "speech":
            entry["rules"] = SPEECH_RULES
        return entry


class CameraRig:
    """The RTSP servers behind the plan's cameras: one for the speech clip, the tone and resizing
    mounts, and one of its own for the camera that drops (killed and started again on its port)."""

    def __init__(self, plan: LoadPlan, work: Path, *, clip: Path | None = None) -> None:
        self.plan = plan
        self.work = work
        self.clip = clip or SAMPLES / "vtest_speech.mp4"
        self.main: RtspServer | None = None
        self.flaky: RtspServer | None = None
        self.flaps = 0

    def start(self) -> CameraRig:
        self.work.mkdir(parents=True, exist_ok=True)
        looped = looped_clip(self.clip, self.plan.seconds + 120, SAMPLES / "soak")
        self.main = RtspServer(clip=looped, log_path=self.work / "rtsp-main.log",
                               resize_every_s=self.plan.resize_every_s).start()
        self.flaky = RtspServer(log_path=self.work / "rtsp-flaky.log").start()
        return self

    def cameras(self) -> list[Camera]:
        assert self.main is not None and self.flaky is not None, "start the rig first"
        plan, found = self.plan, []
        found += [Camera(f"talk{i + 1}", "speech", self.main.url("/vtest")) for i in range(plan.speech_cameras)]
        rest = plan.cameras - len(found)
        if rest > 0:
            found.append(Camera("flaky", "flaky", self.flaky.url("/test")))
        if rest > 1:
            found.append(Camera("resize", "resize", self.main.url("/resize")))
        found += [Camera(f"tone{i + 1}", "tone", self.main.url("/test")) for i in range(rest - 2)]
        return found

    async def flap(self, stop: asyncio.Event) -> None:
        """Kill the flaky camera's server every `flap_every_s`, start it again `flap_down_s` later."""
        assert self.flaky is not None
        while not await _wait(stop, self.plan.flap_every_s):
            await asyncio.to_thread(self.flaky.kill)
            self.flaps += 1
            await _wait(stop, self.plan.flap_down_s)
            await asyncio.to_thread(self.flaky.start)

    def pids(self) -> dict[str, int | None]:
        return {"rtsp_main": self.main.pid if self.main else None, "rtsp_flaky": self.flaky.pid if self.flaky else None}

    def close(self) -> None:
        for server in (self.main, self.flaky):
            if server is not None:
                server.close()

    def __enter__(self) -> CameraRig:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


def serve_config(
    plan: LoadPlan, rig: CameraRig, *, nats_url: str, vlm_url: str | None, work: Path, **sections: dict[str, Any]
) -> dict[str, Any]:
    """The serve config of the soak: the rig's cameras, clips and the timeline on (files under
    `work`), the VLM when given, local WebRTC candidates allowed (the peers run on this machine).
    `sections` are merged over it (a key of a section replaces that key)."""
    config: dict[str, Any] = {
        "nats": {"url": nats_url, "outbox_dir": str(work / "outbox")},
        "http": {"host": "127.0.0.1", "port": 0},
        "clips": {"enabled": True, "dir": str(work / "clips"), "max_total_bytes": 2 * 2**30},
        "timeline": {"enabled": True, "path": str(work / "timeline.sqlite")},
        "webrtc": {"allow_local_candidates": True, "max_sessions": max(4, plan.peers)},
        "streams": [camera.config() for camera in rig.cameras()],
    }
    if vlm_url is not None:
        config["vlm"] = {"endpoints": [vlm_url]}
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    return config


@dataclass
class PeerMedia:
    """What every peer sends, made once: VP8 packets of vtest and 48 kHz speech."""

    vp8: list[bytes]
    speech: np.ndarray
    fps: float

    @classmethod
    def build(cls, plan: LoadPlan, *, size: tuple[int, int] = (640, 480)) -> PeerMedia:
        frames = load_frames(SAMPLES / "vtest.avi", start=100, count=int(plan.peer_fps * 6), size=size)
        speech = load_speech(SAMPLES / "narration.wav", seconds=45.0)
        return cls(encode_vp8(frames, plan.peer_fps), speech, plan.peer_fps)


@dataclass
class LoadStats:
    sse_events: Counter[str] = field(default_factory=Counter)  # by kind, every camera's reader
    sse_connects: int = 0
    sse_errors: int = 0
    channel_messages: Counter[str] = field(default_factory=Counter)  # by kind, every peer
    peer_sessions: int = 0
    peer_refusals: Counter[int] = field(default_factory=Counter)  # by HTTP status
    peer_errors: int = 0
    peer_drops: int = 0  # connections that ended before the peer left
    loop_lag_max_s: float = 0.0  # the load's own event loop, late by this much at worst ...
    loop_lags_over_half_s: int = 0  # ... and this often by more than aioice's 0.5 s STUN timeout
    asks: Counter[int] = field(default_factory=Counter)  # by HTTP status (0: no answer)
    ask_latency_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sse_events": dict(self.sse_events), "sse_connects": self.sse_connects, "sse_errors": self.sse_errors,
            "channel_messages": dict(self.channel_messages), "peer_sessions": self.peer_sessions,
            "peer_refusals": {str(k): v for k, v in self.peer_refusals.items()}, "peer_errors": self.peer_errors,
            "peer_drops": self.peer_drops,
            "loop_lag_max_s": round(self.loop_lag_max_s, 3), "loop_lags_over_half_s": self.loop_lags_over_half_s,
            "asks": {str(k): v for k, v in self.asks.items()},
            "ask_latency_s": [round(x, 2) for x in self.ask_latency_s[-100:]],
        }


class Load:
    """Drives everything but the cameras' media against `base_url` until `stop` is set."""

    def __init__(self, plan: LoadPlan, rig: CameraRig, base_url: str, media: PeerMedia | None,
                 *, token: str | None = None) -> None:
        self.plan = plan
        self.rig = rig
        self.base_url = base_url
        self.media = media
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.stats = LoadStats()
        self._random = random.Random(plan.seed)
        self._offer_lock = asyncio.Lock()  # the service takes one connecting session per client

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(headers=self.headers) as http, asyncio.TaskGroup() as tasks:
            tasks.create_task(self.rig.flap(stop))
            tasks.create_task(self._watch_loop(stop))
            for camera in self.rig.cameras():
                tasks.create_task(self._read_sse(http, camera.id, stop))
            if self.media is not None:
                for index in range(self.plan.peers):
                    tasks.create_task(self._peer(http, f"peer{index + 1}", index, stop))
            if self.plan.ask_every_s > 0:
                tasks.create_task(self._ask(http, stop))

    async def _watch_loop(self, stop: asyncio.Event) -> None:
        """How late this process's loop runs: a peer answers the service's ICE consent checks on
        it, and a check unanswered for 0.5 s counts as failed (six in a row end the session)."""
        while not stop.is_set():
            began = time.monotonic()
            await asyncio.sleep(0.1)
            late = time.monotonic() - began - 0.1
            self.stats.loop_lag_max_s = max(self.stats.loop_lag_max_s, late)
            self.stats.loop_lags_over_half_s += late > 0.5

    async def _read_sse(self, http: aiohttp.ClientSession, stream_id: str, stop: asyncio.Event) -> None:
        """One viewer of the stream's events, reconnecting as a browser's EventSource does."""
        while not stop.is_set():
            try:
                async with http.get(f"{self.base_url}/api/streams/{stream_id}/events",
                                    timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as response:
                    if response.status != 200:
                        self.stats.sse_errors += 1
                    else:
                        self.stats.sse_connects += 1
                        await _until(stop, self._count_sse(response))
            except (aiohttp.ClientError, TimeoutError):
                self.stats.sse_errors += 1
            await _wait(stop, 1.0)

    async def _count_sse(self, response: aiohttp.ClientResponse) -> None:
        async for raw in response.content:
            line = raw.decode(errors="replace")
            if line.startswith("event:"):
                self.stats.sse_events[line[6:].strip()] += 1

    async def _peer(self, http: aiohttp.ClientSession, stream_id: str, index: int, stop: asyncio.Event) -> None:
        """A browser tab that opens a session, stays a while, closes it (as `pagehide` does) and comes back."""
        assert self.media is not None
        await _wait(stop, 5.0 * index)  # the tabs open one after another, not in one burst
        while not stop.is_set():
            pc: RTCPeerConnection | None = None
            try:
                pc, token = await self._open_peer(http, stream_id)
                if token is None:
                    await _wait(stop, 2.0)  # refused (the count says why): try again soon
                    continue
                self.stats.peer_sessions += 1
                ended = asyncio.Event()
                pc.on("connectionstatechange", lambda pc=pc, ended=ended: pc.connectionState in ("failed", "closed")
                      and ended.set())
                # Stay a while, unless the connection ends first (a tab whose call dropped reloads).
                await _until(stop, _first(ended.wait(), asyncio.sleep(self._random.uniform(*self.plan.peer_on_s))))
                if ended.is_set():
                    self.stats.peer_drops += 1
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.post(f"{self.base_url}/api/webrtc/close",
                                         json={"stream_id": stream_id, "close_token": token}) as response:
                        await response.read()
            except Exception:  # a peer's failure is counted; the load goes on
                self.stats.peer_errors += 1
            finally:
                if pc is not None:
                    await pc.close()
            await _wait(stop, self._random.uniform(*self.plan.peer_off_s))

    async def _open_peer(self, http: aiohttp.ClientSession, stream_id: str) -> tuple[RTCPeerConnection, str | None]:
        assert self.media is not None
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        channel = pc.createDataChannel("events")
        channel.on("message", self._on_channel)
        video = EncodedLoopVideoTrack(self.media.vp8, self.media.fps)
        pc.addTrack(video)
        send_vp8_only(pc, video)
        pc.addTrack(LoopAudioTrack(self.media.speech))
        await pc.setLocalDescription(await pc.createOffer())
        body = {"sdp": pc.localDescription.sdp, "type": "offer", "stream_id": stream_id}
        async with self._offer_lock:
            async with http.post(f"{self.base_url}/api/webrtc/offer", json=body) as response:
                answer = await response.json(content_type=None)
                if response.status != 201:
                    self.stats.peer_refusals[response.status] += 1
                    return pc, None
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type="answer"))
            # Hold the next offer until this one is connected: the service counts sessions still
            # connecting per client address, and every peer here has the same one.
            connected = asyncio.Event()
            pc.on("connectionstatechange", lambda: pc.connectionState in ("connected", "failed", "closed")
                  and connected.set())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(15.0):
                    await connected.wait()
        return pc, str(answer.get("close_token"))

    def _on_channel(self, text: Any) -> None:
        try:
            kind = json.loads(text).get("kind", "?")
        except (ValueError, AttributeError):
            kind = "?"
        self.stats.channel_messages[str(kind)] += 1

    async def _ask(self, http: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not await _wait(stop, self.plan.ask_every_s):
            began = time.monotonic()
            try:
                async with http.post(f"{self.base_url}/api/ask", json={"question": QUESTION},
                                     timeout=aiohttp.ClientTimeout(total=120)) as response:
                    await response.read()
                    self.stats.asks[response.status] += 1
            except (aiohttp.ClientError, TimeoutError):
                self.stats.asks[0] += 1
            self.stats.ask_latency_s.append(time.monotonic() - began)
            del self.stats.ask_latency_s[:-1000]


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds` or until `stop` is set; whether it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()


async def _first(*work: Any) -> None:
    """Run the awaitables until the first of them ends; cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _until(stop: asyncio.Event, work: Any) -> None:
    """Run `work` until it ends or `stop` is set, whichever is first."""
    async with asyncio.TaskGroup() as tasks:
        job = tasks.create_task(work)
        stopper = tasks.create_task(stop.wait())
        done, _ = await asyncio.wait({job, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for task in (job, stopper):
            if task not in done:
                task.cancel()
