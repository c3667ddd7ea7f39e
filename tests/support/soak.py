"""One soak run on real parts, and what it checks at the end: shared by `bench/soak.py` (the long run,
by hand) and the short version in the tests.

A real `vidsentry serve` process, a real nats-server with JetStream, the VLM simulator and the load
of tests/support/load.py. Every `interval_s` a sample of the serve process (RSS, fds, threads,
asyncio tasks; queues and buffers; every stream's measured and predicted fps, caption lag, audio
dropped; outbox, clip store, index lag) is appended and handed to `on_sample` (the bench writes its
JSON there, so a run cut short leaves its samples). At the end:
  - every durable event the service counted as published is in JetStream exactly once (the counts
    from its "service stopped" log line, the ids seen on the wire by a plain subscriber of the
    durable subjects, against the `ce-id`s JetStream holds);
  - every clip `GET /api/clips` lists opens and decodes (PyAV);
  - every final caption and transcript JetStream holds is in the timeline's index.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import av
import nats
import nats.errors
from prometheus_client.parser import text_string_to_metric_families

from pipelines.events import DURABLE_KINDS
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import DURABLE_SUBJECTS, STREAM_NAME
from tests.support.load import CameraRig, Load, LoadPlan, PeerMedia, serve_config
from tests.support.serve_process import ServeProcess, write_config
from tests.support.vllm_sim import VllmSimulator

DURABLE = sorted(kind.value for kind in DURABLE_KINDS)
# Per-stream counters a sample keeps (the rest of /api/streams' counters are in the final sample).
STREAM_KEYS = ("frames_in", "frames_processed", "frames_predicted", "frames_dropped", "caption_lag_seconds",
               "audio_dropped_seconds", "audio_buffered_s", "mailbox_depth", "status_queue_depth",
               "channel_queue_depth", "reconnects", "task_crashes", "captions", "alerts", "descriptions")
PROCESS_KEYS = {"process_resident_memory_bytes": "rss_bytes", "process_open_fds": "open_fds",
                "vidsentry_os_threads": "os_threads", "vidsentry_python_threads": "python_threads",
                "vidsentry_asyncio_tasks": "asyncio_tasks"}


@dataclass
class SoakResult:
    plan: dict[str, Any]
    seconds: float
    started_at: float
    live_after_s: float | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)
    events: dict[str, Any] = field(default_factory=dict)
    clips: dict[str, Any] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)
    serve: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


async def scrape(http: aiohttp.ClientSession, url: str) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(unlabelled samples, labelled ones as {name: {label=value,...: value}}) of `/metrics`."""
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    plain: dict[str, float] = {}
    labelled: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels:
                key = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                labelled.setdefault(sample.name, {})[key] = sample.value
            else:
                plain[sample.name] = sample.value
    return plain, labelled


def dir_size(path: Path) -> tuple[int, int]:
    """(files, bytes) under `path`."""
    files = size = 0
    if path.exists():
        for entry in path.rglob("*"):
            with contextlib.suppress(OSError):
                if entry.is_file():
                    files += 1
                    size += entry.stat().st_size
    return files, size


class Sampler:
    def __init__(self, http: aiohttp.ClientSession, url: str, work: Path) -> None:
        self.http, self.url, self.work = http, url, work
        self._last: dict[str, dict[str, float]] = {}
        self._last_t: float | None = None
        self.began = time.monotonic()

    async def sample(self) -> dict[str, Any]:
        now = time.monotonic()
        plain, labelled = await scrape(self.http, self.url)
        async with self.http.get(f"{self.url}/api/streams") as response:
            streams = (await response.json())["streams"]
        async with self.http.get(f"{self.url}/readyz") as response:
            ready = response.status
        span = None if self._last_t is None else now - self._last_t
        per_stream: dict[str, Any] = {}
        for stream in streams:
            counters = stream.get("counters", {})
            before = self._last.get(stream["id"], {})
            row: dict[str, Any] = {"state": stream.get("state"), "restarts": stream.get("restarts", 0)}
            row.update({k: counters.get(k) for k in STREAM_KEYS})
            for name in ("frames_in", "frames_processed", "frames_predicted", "frames_dropped"):
                if span and name in before and counters.get(name) is not None:
                    row[f"{name.removeprefix('frames_')}_fps"] = round((counters[name] - before[name]) / span, 2)
            per_stream[stream["id"]] = row
            self._last[stream["id"]] = counters
        self._last_t = now
        clips_files, clips_bytes = dir_size(self.work / "clips")
        sample: dict[str, Any] = {
            "t_s": round(now - self.began, 1),
            "ready": ready,
            **{short: plain.get(name) for name, short in PROCESS_KEYS.items()},
            "nats_pending_acks": plain.get("vidsentry_nats_pending_acks"),
            "nats_retry_backlog": plain.get("vidsentry_nats_retry_backlog"),
            "outbox_events": plain.get("vidsentry_outbox_events"),
            "outbox_bytes": plain.get("vidsentry_outbox_bytes"),
            "sse_viewers": plain.get("vidsentry_sse_viewers"),
            "sse_events_dropped": plain.get("vidsentry_sse_events_dropped_total"),
            "detector_rejected": plain.get("vidsentry_detector_rejected_total"),
            "asr_rejected": plain.get("vidsentry_asr_rejected_total"),
            "webrtc_sessions": plain.get("vidsentry_webrtc_sessions"),
            "timeline_pending": plain.get("vidsentry_timeline_pending"),
            "timeline_entries": plain.get("vidsentry_timeline_entries"),
            "index_lag_p50_s": plain.get("vidsentry_timeline_lag_p50_seconds"),
            "clip_files": clips_files,
            "clip_bytes": clips_bytes,
            "published": labelled.get("vidsentry_events_published_total", {}),
            "streams": per_stream,
        }
        return sample


async def wait_live(http: aiohttp.ClientSession, url: str, ids: list[str], within_s: float) -> float:
    began = time.monotonic()
    while True:
        async with http.get(f"{url}/api/streams") as response:
            states = {s["id"]: s.get("state") for s in (await response.json())["streams"]}
        if all(states.get(i) == "live" for i in ids):
            return time.monotonic() - began
        if time.monotonic() - began > within_s:
            raise AssertionError(f"streams not live within {within_s} s: {states}")
        await asyncio.sleep(0.5)


class WireIds:
    """The `ce-id` of every durable event seen on the wire (a plain subscriber of the durable subjects)."""

    def __init__(self) -> None:
        self.ids: dict[str, set[str]] = {}
        self._nc: Any = None

    async def start(self, url: str) -> None:
        self._nc = await nats.connect(url, max_reconnect_attempts=-1)
        for subject in DURABLE_SUBJECTS:
            await self._nc.subscribe(subject, cb=self._on)

    async def _on(self, msg: Any) -> None:
        kind = msg.subject.rsplit(".", 1)[-1]
        if msg.headers and "ce-id" in msg.headers:
            self.ids.setdefault(kind, set()).add(msg.headers["ce-id"])

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()


async def stored_ids(url: str) -> tuple[dict[str, Counter[str]], int]:
    """Every durable event JetStream holds up to now: {kind: Counter(ce-id)}, and the last stream
    sequence read (events published meanwhile are left for a later read)."""
    nc = await nats.connect(url)
    found: dict[str, Counter[str]] = {}
    last = 0
    try:
        js = nc.jetstream()
        upto = (await js.stream_info(STREAM_NAME)).state.last_seq
        if upto:
            sub = await js.subscribe("vidsentry.>", ordered_consumer=True)
            while last < upto:
                try:
                    msg = await sub.next_msg(timeout=10.0)
                except nats.errors.TimeoutError:
                    break
                kind = msg.subject.rsplit(".", 1)[-1]
                found.setdefault(kind, Counter())[(msg.headers or {}).get("ce-id", "")] += 1
                last = msg.metadata.sequence.stream
    finally:
        await nc.close()
    return found, last


def indexed(index_path: Path, ids: set[str]) -> set[str]:
    """The ids of `ids` the timeline's SQLite index has (read-only, beside the writer)."""
    if not ids or not index_path.exists():
        return set()
    db = sqlite3.connect(f"file:{index_path}?mode=ro", uri=True, timeout=10)
    try:
        present: set[str] = set()
        wanted = sorted(ids)
        for begin in range(0, len(wanted), 500):
            chunk = wanted[begin : begin + 500]
            marks = ",".join("?" * len(chunk))
            present |= {row[0] for row in db.execute(f"SELECT event_id FROM events WHERE event_id IN ({marks})", chunk)}
        return present
    finally:
        db.close()


async def check_clips(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """Every listed clip is fetched and decoded: every packet demuxed, every keyframe decoded."""
    async with http.get(f"{url}/api/clips") as response:
        listing = await response.json()
    bad: list[dict[str, Any]] = []
    opened = 0
    for clip in listing.get("clips", []):
        async with http.get(f"{url}/api/clips/{clip['clip_id']}.mp4") as response:
            status, data = response.status, await response.read()
        if status != 200:
            bad.append({"id": clip["clip_id"], "status": status})
            continue
        try:
            frames = await asyncio.to_thread(_decode_keyframes, data)
        except Exception as exc:  # any decode failure is the finding
            bad.append({"id": clip["clip_id"], "error": repr(exc)[:200]})
            continue
        if frames == 0:
            bad.append({"id": clip["clip_id"], "error": "no picture"})
        else:
            opened += 1
    return {"listed": len(listing.get("clips", [])), "total": listing.get("total"), "opened": opened, "bad": bad[:50]}


def _decode_keyframes(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.codec_context.skip_frame = "NONKEY"
        pictures = 0
        for packet in container.demux(stream):
            pictures += len(packet.decode())
        return pictures


async def check_index(http_url: str, nats_url: str, index_path: Path, within_s: float = 60.0) -> dict[str, Any]:
    """Every caption and transcript JetStream holds now is in the index within `within_s`."""
    stored, last_seq = await stored_ids(nats_url)
    wanted = {i for kind in ("captions", "transcript") for i in stored.get(kind, {})}
    began = time.monotonic()
    present = indexed(index_path, wanted)
    while present != wanted and time.monotonic() - began < within_s:
        await asyncio.sleep(1.0)
        present = indexed(index_path, wanted)
    return {"captions": len(stored.get("captions", {})), "transcripts": len(stored.get("transcript", {})),
            "missing": len(wanted - present), "missing_ids": sorted(wanted - present)[:20],
            "waited_s": round(time.monotonic() - began, 1), "stream_seq": last_seq}


def stopped_counts(serve: ServeProcess) -> dict[str, dict[str, int]] | None:
    for record in serve.log_records():
        if record.get("msg") == "service stopped":
            events = record.get("events")
            return events if isinstance(events, dict) else None
    return None


def event_accounting(published: dict[str, dict[str, int]] | None, wire: dict[str, set[str]],
                     stored: dict[str, Counter[str]]) -> dict[str, Any]:
    per_kind: dict[str, Any] = {}
    lost = duplicated = 0
    for kind in DURABLE:
        held = stored.get(kind, Counter())
        dups = sum(n - 1 for n in held.values() if n > 1)
        unseen = len(wire.get(kind, set()) - set(held))
        counts = (published or {}).get(kind, {})
        short = max(0, counts.get("published", 0) - counts.get("failed", 0) - counts.get("dropped", 0) - len(held))
        per_kind[kind] = {"published": counts.get("published"), "acked": counts.get("acked"),
                          "failed": counts.get("failed"), "dropped": counts.get("dropped"),
                          "stored": len(held), "duplicates": dups, "on_wire_not_stored": unseen,
                          "published_not_stored": short}
        lost += max(unseen, short)
        duplicated += dups
    return {"lost": lost, "duplicated": duplicated, "counts_logged": published is not None, "kinds": per_kind}


async def run_soak(
    plan: LoadPlan,
    work: Path,
    *,
    seconds: float,
    interval_s: float = 10.0,
    on_sample: Callable[[SoakResult], None] | None = None,
    peers: bool = True,
    start_timeout_s: float = 300.0,
    live_within_s: float = 120.0,
    config_sections: dict[str, dict[str, Any]] | None = None,
) -> SoakResult:
    """The whole run: start everything, load and sample for `seconds`, stop, check."""
    await asyncio.to_thread(work.mkdir, parents=True, exist_ok=True)
    result = SoakResult(plan=plan.__dict__ | {"peer_on_s": list(plan.peer_on_s), "peer_off_s": list(plan.peer_off_s)},
                        seconds=seconds, started_at=time.time())
    media = await asyncio.to_thread(PeerMedia.build, plan) if peers and plan.peers else None
    nats_server = EmbeddedNatsServer(store_dir=work / "nats")
    nats_server.start()
    rig = CameraRig(plan, work)
    wire = WireIds()
    try:
        await asyncio.to_thread(rig.start)
        async with VllmSimulator(latency_s=0.3) as sim:
            config = serve_config(plan, rig, nats_url=nats_server.url, vlm_url=sim.url, work=work,
                                  **(config_sections or {}))
            write_config(work / "serve.yaml", config)
            await wire.start(nats_server.url)
            serve = ServeProcess("--config", str(work / "serve.yaml"), log_dir=work)
            try:
                await asyncio.to_thread(serve.start, within_s=start_timeout_s)
                url = serve.url
                assert url is not None
                async with aiohttp.ClientSession() as http:
                    ids = [c.id for c in rig.cameras()]
                    result.live_after_s = round(await wait_live(http, url, ids, live_within_s), 1)
                    load = Load(plan, rig, url, media)
                    stop = asyncio.Event()
                    sampler = Sampler(http, url, work)
                    async with asyncio.TaskGroup() as tasks:
                        tasks.create_task(load.run(stop))
                        end = time.monotonic() + seconds
                        while time.monotonic() < end:
                            await asyncio.sleep(min(interval_s, max(0.0, end - time.monotonic())))
                            if serve.proc is not None and serve.proc.poll() is not None:
                                stop.set()
                                raise AssertionError(f"serve exited with {serve.proc.returncode}")
                            result.samples.append(await sampler.sample())
                            result.load = load.stats.as_dict() | {"flaps": rig.flaps}
                            if on_sample is not None:
                                on_sample(result)
                        stop.set()
                    result.load = load.stats.as_dict() | {"flaps": rig.flaps}
                    result.clips = await check_clips(http, url)
                    result.index = await check_index(url, nats_server.url, work / "timeline.sqlite")
                    async with http.get(f"{url}/api/streams") as response:
                        result.serve["final_streams"] = (await response.json())["streams"]
                code = await asyncio.to_thread(serve.terminate, 60)
            finally:
                serve.kill()
            await asyncio.sleep(1.0)  # the subscriber sees the last acks' messages
            await wire.close()
            stored, _ = await stored_ids(nats_server.url)
            result.events = event_accounting(stopped_counts(serve), wire.ids, stored)
            records = serve.log_records()
            result.serve |= {
                "exit_code": code,
                "errors": sum(1 for r in records if r.get("level") in ("error", "critical")),
                "warnings": Counter(str(r.get("msg"))[:80] for r in records
                                    if r.get("level") == "warning").most_common(15),
                "error_messages": Counter(str(r.get("msg"))[:80] for r in records
                                          if r.get("level") in ("error", "critical")).most_common(15),
                "tracebacks": serve.stderr().count("Traceback"),
            }
            if on_sample is not None:
                on_sample(result)
    finally:
        await wire.close()
        rig.close()
        nats_server.stop()
    return result


def slope_pct_per_10min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t_s, value) as a percentage of the mean value per 10 minutes."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0 or mean_v == 0:
        return None
    slope = sum((t - mean_t) * (v - mean_v) for t, v in points) / var
    return round(slope * 600 / mean_v * 100, 3)


def targets(result: SoakResult) -> dict[str, Any]:
    """The figures the issue's targets are about: slopes of the last third, restarts, drift, lost/dup."""
    samples = [s for s in result.samples if s.get("rss_bytes") is not None]
    if not samples:
        return {}
    end = samples[-1]["t_s"]
    last = [s for s in samples if s["t_s"] >= end * 2 / 3]
    middle = [s for s in samples if end / 3 <= s["t_s"] < end * 2 / 3]
    slopes = {key: slope_pct_per_10min([(s["t_s"], float(s[key])) for s in last if s.get(key) is not None])
              for key in ("rss_bytes", "open_fds", "os_threads", "asyncio_tasks")}
    levels = {key: round(sum(float(s[key]) for s in last) / len(last), 1) for key in slopes}
    final_streams = result.serve.get("final_streams") or []
    restarts = sum(int(s.get("restarts", 0)) for s in final_streams)
    crashes = sum(int(s.get("counters", {}).get("task_crashes", 0)) for s in final_streams)

    def mean_of(rows: list[dict[str, Any]], key: str, ids: list[str]) -> float | None:
        values = [float(r["streams"][i][key]) for r in rows for i in ids
                  if i in r["streams"] and r["streams"][i].get(key) is not None]
        return round(sum(values) / len(values), 3) if values else None

    speech = [i for i in samples[-1]["streams"] if i.startswith("talk")]
    cameras = [i for i in samples[-1]["streams"] if not i.startswith("peer")]
    drift = {
        "caption_lag_s": {"middle_third": mean_of(middle, "caption_lag_seconds", speech),
                          "last_third": mean_of(last, "caption_lag_seconds", speech)},
        "processed_fps_per_camera": {"middle_third": mean_of(middle, "processed_fps", cameras),
                                     "last_third": mean_of(last, "processed_fps", cameras)},
        "predicted_fps_per_camera": {"middle_third": mean_of(middle, "predicted_fps", cameras),
                                     "last_third": mean_of(last, "predicted_fps", cameras)},
    }
    return {
        "last_third_slope_pct_per_10min": slopes,
        "last_third_level": levels,
        "flat": all(v is not None and abs(v) < 1.0 for v in slopes.values()),
        "stream_restarts": restarts,
        "task_crashes": crashes,
        "drift": drift,
        "lost": result.events.get("lost"),
        "duplicated": result.events.get("duplicated"),
        "clips_bad": len(result.clips.get("bad", [])),
        "captions_missing_from_index": result.index.get("missing"),
        "not_ready_samples": sum(1 for s in samples if s.get("ready") != 200),
    }


def write_json(path: Path, payload: dict[str, Any]) -> None:
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(payload, indent=1, default=str))
    partial.replace(path)
