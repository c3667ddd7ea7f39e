"""A fleet of `vidsentry serve` workers on a real 3-node NATS cluster under a light, steady load,
faults injected into either, and what each fault cost: for bench/chaos.py (the whole schedule)
and tests/realtime/fleet/test_chaos.py (one node killed, in CI).

Faults are judged from outside, as an operator would see them, never from the service's own
account of itself: a recorder on the cluster hears every event the workers publish (so a durable
event that was sent but never stored is a loss), a sampler reads every worker's `/readyz` and
`/metrics` twice a second (so a stall of JetStream acks, a clip upload or `/readyz` saying
not-ready is seen when it happened), and a probe publishes a marker caption at each fault and
times how long the fleet's timeline takes to find it.

Everything recorded is bounded: the recorder and the sampler keep a fixed number of entries, and
count what they had to drop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import nats
import nats.errors
import nats.js.errors
import yaml

from pipelines.event_bodies import caption_event
from realtime.bus.connection import BusUnavailable, round_trip
from realtime.bus.jetstream import STREAM_NAME
from realtime.bus.publisher import NatsEventPublisher
from tests.realtime.fleet.fleet_support import Fleet, Worker, http
from tests.support.nats import stored_event_ids
from tests.support.nats_cluster import ClusterNode, NatsCluster
from tests.support.waiting import poll

# A renewal sent while a bucket elects a new leader waits out its request timeout: the TTL
# outlasts an election (docs/operations.md, "Running many workers"; tests/realtime/fleet/test_cluster.py).
LEASES = {"lease_ttl_s": 15.0, "renew_interval_s": 1.0}
CLIPS = {"enabled": True, "pre_s": 1.0, "post_s": 1.0, "max_s": 4.0, "buffer_s": 20.0}
# Kinds the publisher stores in JetStream (docs/events.md); the rest are live-only.
DURABLE_KINDS = frozenset({"tracks", "alerts", "captions", "transcript", "descriptions", "status", "clips"})
MARK = "chaosmarker"
SAMPLE_EVERY_S = 0.5


def stream_body(stream_id: str, url: str, detect_fps: float) -> dict[str, Any]:
    """A camera with a rule that fires on every person the fall model sees (so clips are cut)."""
    return {"id": stream_id, "url": url, "audio": False, "detect_fps": detect_fps,
            "rules": [{"id": "people", "type": "present", "classes": ["Normal"], "for_s": 0.5}]}


# -- the wire: every event the workers publish ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Heard:
    at: float  # time.monotonic() here
    kind: str
    stream_id: str
    node: str
    ce_id: str
    phase: str | None  # alerts: start / end
    alert_id: str | None


class WireRecorder:
    """Every event on `vidsentry.>`, heard through any node of the cluster (reconnecting to a
    survivor when its node goes), in a thread of its own."""

    def __init__(self, urls: list[str], max_events: int = 500_000) -> None:
        self.urls = urls
        self.max_events = max_events
        self.events: list[Heard] = []
        self.dropped = 0
        self.reconnects = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="wire-recorder", daemon=True)

    def __enter__(self) -> WireRecorder:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the wire recorder did not subscribe")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def snapshot(self) -> list[Heard]:
        with self._lock:
            return list(self.events)

    async def _run(self) -> None:
        async def reconnected() -> None:
            self.reconnects += 1

        nc = await nats.connect(self.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.25,
                                reconnected_cb=reconnected)

        async def take(msg: Any) -> None:
            headers = msg.headers or {}
            parts = headers.get("ce-source", "").split("/")
            kind = msg.subject.split(".")[-1]
            phase = alert_id = None
            if kind == "alerts":
                with contextlib.suppress(ValueError, AttributeError):
                    body = json.loads(msg.data)
                    phase, alert_id = body.get("event"), body.get("alert_id")
            heard = Heard(time.monotonic(), kind, parts[-1] if parts else "", parts[2] if len(parts) > 3 else "",
                          headers.get("ce-id", ""), phase, alert_id)
            with self._lock:
                if len(self.events) < self.max_events:
                    self.events.append(heard)
                else:
                    self.dropped += 1

        await nc.subscribe("vidsentry.>", cb=take)
        await round_trip(nc)
        self._ready.set()
        await asyncio.to_thread(self._stop.wait)
        with contextlib.suppress(Exception):
            await nc.drain()


async def _stored_ids(urls: list[str]) -> list[str]:
    return await stored_event_ids(urls, timeout_s=3.0, max_reconnect_attempts=5, reconnect_time_wait=0.25)


def stored_ids(urls: list[str], within_s: float = 60.0) -> list[str]:
    """ce-id of every message VIDSENTRY holds; a node just back answers 503 until it caught up: retried."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return asyncio.run(_stored_ids(urls))
        except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError, nats.errors.NoServersError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


async def _leader(urls: list[str]) -> str | None:
    nc = await nats.connect(urls, connect_timeout=2, max_reconnect_attempts=2)
    try:
        info = await nc.jetstream().stream_info(STREAM_NAME)
        return info.cluster.leader if info.cluster is not None else None
    finally:
        await nc.close()


def stream_leader(urls: list[str], within_s: float = 20.0) -> str:
    """The server that leads VIDSENTRY, from JetStream's stream info (retried through an election)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(nats.errors.Error, OSError, asyncio.TimeoutError):
            leader = asyncio.run(_leader(urls))
            if leader:
                return leader
        time.sleep(0.2)
    raise RuntimeError(f"VIDSENTRY has no leader within {within_s:g} s")


# -- the workers, sampled -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    worker: str
    ready: bool | None  # None: no answer at all
    failing: tuple[str, ...]
    acked: float  # durable events JetStream stored, all kinds
    backlog: float  # durable events waiting: unacked, to retry, or on disk
    uploads: float  # clips uploaded to the fleet's bucket


@dataclass(frozen=True, slots=True)
class Ownership:
    at: float
    owners: dict[str, tuple[str | None, str]]  # stream -> (owner, state)


def _metric_sum(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:_total)?(?:\{{[^}}]*\}})? ([-\d.e+]+)$", text, re.M))


class Sampler:
    """Reads every live worker's `/readyz` and `/metrics`, and one worker's listing, every
    SAMPLE_EVERY_S, in a thread; the newest `max_samples` are kept."""

    def __init__(self, fleet: Fleet, streams: list[str], max_samples: int = 50_000) -> None:
        self.fleet = fleet
        self.streams = streams
        self.samples: collections.deque[Sample] = collections.deque(maxlen=max_samples)
        self.owners: collections.deque[Ownership] = collections.deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def series(self, since: float = 0.0) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if s.at >= since]

    def ownership(self, since: float = 0.0) -> list[Ownership]:
        with self._lock:
            return [o for o in self.owners if o.at >= since]

    def _one(self, worker: Worker) -> Sample:
        at = time.monotonic()
        try:
            status, body = http("GET", f"{worker.url}/readyz", timeout=2)
            ready: bool | None = status == 200
            failing = tuple((body.get("detail") or {}).get("failing", []) if isinstance(body, dict) else ())
        except OSError:
            ready, failing = None, ()
        try:
            status, text = http("GET", f"{worker.url}/metrics", timeout=2)
            text = text if status == 200 and isinstance(text, str) else ""
        except OSError:
            text = ""
        backlog = sum(_metric_sum(text, n) for n in
                      ("vidsentry_nats_pending_acks", "vidsentry_nats_retry_backlog", "vidsentry_outbox_events"))
        return Sample(at, worker.name, ready, failing, _metric_sum(text, "vidsentry_events_acked"), backlog,
                      _metric_sum(text, "vidsentry_clip_bucket_uploads"))

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            live = self.fleet.live()
            taken = [self._one(w) for w in live]
            listing = None
            for worker in live:
                with contextlib.suppress(OSError, AssertionError, KeyError, TypeError):
                    listing = Ownership(time.monotonic(), {sid: (s["owner"], s["state"])
                                                           for sid, s in worker.streams().items()})
                    break
            with self._lock:
                self.samples.extend(taken)
                if listing is not None:
                    self.owners.append(listing)
            self._stop.wait(max(0.0, SAMPLE_EVERY_S - (time.monotonic() - began)))


class LeaderWatch:
    """Asks JetStream who leads VIDSENTRY every 0.25 s, in a thread: when the stream had no
    leader that answered (a request that timed out or failed counts as none)."""

    def __init__(self, urls: list[str], max_entries: int = 100_000) -> None:
        self.urls = urls
        self.seen: collections.deque[tuple[float, str | None]] = collections.deque(maxlen=max_entries)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="leader-watch", daemon=True)

    def __enter__(self) -> LeaderWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)

    async def _run(self) -> None:
        nc = await nats.connect(self.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.25)
        js = nc.jetstream(timeout=1.0)
        while not self._stop.is_set():
            leader: str | None = None
            try:
                info = await js.stream_info(STREAM_NAME)
                leader = info.cluster.leader if info.cluster is not None else None
            except Exception:  # any failure is an answer: no leader now
                with contextlib.suppress(Exception):
                    try:
                        await nc.flush(timeout=1)
                    except nats.errors.TimeoutError:
                        await nc.force_reconnect()  # our node is frozen: ask another
            self.seen.append((time.monotonic(), leader))
            await asyncio.sleep(0.25)
        with contextlib.suppress(Exception):
            await nc.close()

    def leaderless(self, since: float, until: float) -> tuple[float, float]:
        """(seconds without a leader in [since, until]; when the last such stretch ended, or `since`)."""
        without = 0.0
        back_at = since
        entries = [e for e in list(self.seen) if since <= e[0] <= until]
        for (at, leader), (nxt, _) in zip(entries, entries[1:], strict=False):
            if leader is None:
                without += nxt - at
                back_at = nxt
        return round(without, 2), back_at


# -- the timeline probe ---------------------------------------------------------------------


class MarkerProbe:
    """Publishes one marker caption per fault (as a stream of its own, `chaos-probe`) and finds
    it through the fleet's search: how long until the timeline indexes again."""

    def __init__(self, urls: str, fleet: Fleet) -> None:
        self.urls = urls
        self.fleet = fleet
        self.sent: dict[str, float] = {}  # marker word -> monotonic time it was handed over
        self.found_at: dict[str, float] = {}  # ... and when a search first found it

    def publish(self, n: int) -> str:
        word = f"{MARK}{n}"

        async def send() -> None:
            pub = NatsEventPublisher(self.urls, node="chaos-probe", stream_replicas=3, ack_timeout=2.0)
            deadline = time.monotonic() + 60
            while True:  # a marker is the fault's probe: it is sent whatever the cluster says at first
                try:
                    await pub.connect()
                    break
                except BusUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
            async with pub:
                event = caption_event("chaosprobe", segment_id=f"m{n}", words=[(f" {word}", 0.0, 0.4, 0.9)],
                                      language="en", model="probe", captured_at=time.time())
                await pub.publish(event)
                if not await pub.flush(60):
                    raise RuntimeError(f"marker {word} not acked within 60 s")

        def look(within_s: float = 240.0) -> None:
            began = time.monotonic()
            while time.monotonic() - began < within_s:
                if self.found(word):
                    self.found_at[word] = time.monotonic()
                    return
                time.sleep(0.5)

        self.sent[word] = time.monotonic()
        # Threads and a loop of their own: the fault goes on while the marker waits for a leader.
        threading.Thread(target=lambda: asyncio.run(send()), name=f"marker-{n}", daemon=True).start()
        threading.Thread(target=look, name=f"marker-{n}-search", daemon=True).start()
        return word

    @staticmethod
    def hits(worker: Worker, word: str) -> list[str] | None:
        with contextlib.suppress(OSError):
            status, body = http("GET", f"{worker.url}/api/search?q={word}&limit=20", timeout=3)
            if status == 200 and isinstance(body, dict):
                return [h["event_id"] for h in body["hits"]]
        return None

    def found(self, word: str) -> bool:
        return any((self.hits(w, word) or []) for w in self.fleet.live())


# -- one fault's account --------------------------------------------------------------------


@dataclass
class FaultReport:
    name: str
    started: float  # monotonic, when the fault was injected
    quorum_at: float  # when the cluster had a quorum again (== started when it never lost one)
    ended: float = 0.0  # when the fault was over (node back, worker restarted)
    settled: float = 0.0  # when the measurement window closed
    marker: str = ""
    indexing_back_s: float | None = None
    notes: list[str] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)


STALL_S = 2.0  # an ack gap longer than this, with events waiting, is a stall (acks come every ~0.5 s here)


def _per_worker(samples: list[Sample], skip: Iterable[str]) -> list[list[Sample]]:
    by_worker: dict[str, list[Sample]] = collections.defaultdict(list)
    for s in samples:
        if s.worker not in skip and s.ready is not None:
            by_worker[s.worker].append(s)
    return list(by_worker.values())


def publishing_back(samples: list[Sample], since: float, skip: Iterable[str] = (),
                    until: float = float("inf")) -> tuple[float, float]:
    """(seconds from `since` until the last worker's last stall ended: 0 when none stalled; the
    longest time one worker went without a new ack while events waited). A stall is an ack gap
    longer than STALL_S that ends after `since` and began before `until` (one that begins later,
    on a loaded machine, is not the fault's)."""
    back = longest = 0.0
    for series in _per_worker(samples, skip):
        last_ack = series[0]
        for prev, s in zip(series, series[1:], strict=False):
            if s.acked > prev.acked:
                gap = s.at - last_ack.at
                if gap > STALL_S and s.at >= since and last_ack.at <= until and \
                        max(x.backlog for x in series if last_ack.at <= x.at <= s.at) > 0:
                    longest = max(longest, gap)
                    back = max(back, s.at - since)
                last_ack = s
    return back, longest


def readiness(samples: list[Sample], skip: Iterable[str] = ()) -> dict[str, float]:
    """Seconds, for the worst worker, that `/readyz` and the worker's real state disagreed. A worker
    is stalled while no ack has come for STALL_S and events wait (it cannot do its job); said
    not-ready while acks flowed with nothing waiting is a false alarm, said ready while stalled
    a miss."""
    worst = {"not_ready_s": 0.0, "stalled_s": 0.0, "not_ready_while_working_s": 0.0, "ready_while_stalled_s": 0.0}
    for series in _per_worker(samples, skip):
        totals = dict.fromkeys(worst, 0.0)
        last_ack_at = series[0].at
        for prev, s in zip(series, series[1:], strict=False):
            step = s.at - prev.at
            if s.acked > prev.acked:
                last_ack_at = s.at
            is_stalled = s.at - last_ack_at > STALL_S and s.backlog > 0
            flowing = s.acked > prev.acked and s.backlog <= max(prev.backlog, 2.0)
            totals["not_ready_s"] += step * (s.ready is False)
            totals["stalled_s"] += step * is_stalled
            totals["not_ready_while_working_s"] += step * (s.ready is False and flowing)
            totals["ready_while_stalled_s"] += step * (s.ready is True and is_stalled)
        for key, value in totals.items():
            worst[key] = max(worst[key], round(value, 1))
    return worst


def first_after(since: float, condition: Callable[[Any], bool], items: Iterable[Any]) -> float | None:
    """Seconds from `since` to the first of `items` (each with an `at`) that meets `condition`."""
    for item in items:
        if item.at >= since and condition(item):
            return float(item.at - since)
    return None


# -- the rig --------------------------------------------------------------------------------


class ChaosRig:
    """The cluster, the fleet on it with `streams` cameras, the recorder, the sampler, the probe."""

    def __init__(self, cluster: NatsCluster, model: Path, root: Path, rtsp_urls: list[str], *,
                 workers: int = 3, detect_fps: float = 2.0, leases: dict[str, float] | None = None) -> None:
        self.cluster = cluster
        self.root = root
        self.urls = [node.url for node in cluster.nodes]
        self.streams = [f"cam{i}" for i in range(len(rtsp_urls))]
        self.rtsp_urls = rtsp_urls
        self.detect_fps = detect_fps
        self.leases = leases or LEASES
        self.fleet = Fleet(cluster.url, model, root, name="chaos", fleet=self.leases, capacity=4,
                           extra={"clips": CLIPS, "timeline": {"enabled": True}})
        config = yaml.safe_load(self.fleet.config.read_text())
        self.fleet.config.write_text(yaml.safe_dump({**config, "nats": {"replicas": 3}}))
        self.names = [f"w{i}" for i in range(workers)]
        self.recorder = WireRecorder(self.urls)
        self.sampler = Sampler(self.fleet, self.streams)
        self.leaders = LeaderWatch(self.urls)
        self.probe = MarkerProbe(cluster.url, self.fleet)
        self.reports: list[FaultReport] = []
        self._markers = 0

    def env(self, name: str) -> dict[str, str]:
        # Each worker its own disk, kept across its restarts, as on separate machines.
        return {"VIDSENTRY_CLIPS__DIR": str(self.root / f"{name}-clips"),
                "VIDSENTRY_NATS__OUTBOX_DIR": str(self.root / f"{name}-outbox")}

    def start(self) -> None:
        self.fleet.start(*self.names, env={name: self.env(name) for name in self.names})
        first = self.fleet.workers[self.names[0]]
        for sid, url in zip(self.streams, self.rtsp_urls, strict=True):
            status, body = http("POST", f"{first.url}/api/streams", stream_body(sid, url, self.detect_fps))
            if status != 201:
                raise RuntimeError(f"adding {sid}: {status} {body}")
        self.recorder.__enter__()
        self.sampler.__enter__()
        self.leaders.__enter__()
        self.wait(self.all_owned, 90, "every stream live on a worker")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.leaders.__exit__()
        with contextlib.suppress(Exception):
            self.sampler.__exit__()
        with contextlib.suppress(Exception):
            self.recorder.__exit__()
        self.fleet.kill_all()

    # -- conditions -------------------------------------------------------------------------

    @staticmethod
    def wait(condition: Callable[[], Any], within_s: float, what: str, every_s: float = 0.25) -> float:
        return poll(condition, within_s, what, every_s, error=TimeoutError)

    def all_owned(self) -> bool:
        live = {w.name for w in self.fleet.live()}
        seen = self.sampler.ownership()
        if not seen:
            return False
        owners = seen[-1].owners
        return all(sid in owners and owners[sid][0] in live and owners[sid][1] == "live" for sid in self.streams)

    def serving_node(self, client_name: str) -> ClusterNode:
        """The node a named NATS connection (`vidsentry-publisher@w0`) is on, from its monitor."""
        for node in self.cluster.nodes:
            connz = node.monitor("/connz?limit=1024") or {}
            if any(conn.get("name") == client_name for conn in connz.get("connections") or []):
                return node
        raise RuntimeError(f"no NATS node has a connection named {client_name}")

    def index_holder(self) -> str | None:
        for worker in self.fleet.live():
            with contextlib.suppress(OSError):
                status, body = http("GET", f"{worker.url}/api/search?q={MARK}&limit=1", timeout=3)
                if status == 200 and isinstance(body, dict):
                    return str(body["index"].get("node"))
        return None

    # -- faults -----------------------------------------------------------------------------

    def begin(self, name: str) -> FaultReport:
        self._markers += 1
        now = time.monotonic()
        report = FaultReport(name, now, now)
        report.marker = self.probe.publish(self._markers)
        self.reports.append(report)
        return report

    def settle(self, report: FaultReport, within_s: float = 60.0, skip: Iterable[str] = ()) -> FaultReport:
        """Wait for the fleet to be whole again (streams owned, the marker indexed, acks flowing),
        then measure the fault from the samples."""
        report.ended = report.ended or time.monotonic()
        with contextlib.suppress(TimeoutError):
            self.wait(lambda: report.marker in self.probe.found_at, within_s, f"{report.marker} indexed")
        if report.marker in self.probe.found_at:
            report.indexing_back_s = round(self.probe.found_at[report.marker] - report.started, 2)
        with contextlib.suppress(TimeoutError):
            self.wait(self.all_owned, within_s, "every stream owned")
        past = time.monotonic() + 2 * SAMPLE_EVERY_S
        self.wait(lambda: all(any(s.at > past for s in self.sampler.series(past) if s.worker == w.name)
                              for w in self.fleet.live()), 30, "samples past the end of the fault")
        report.settled = time.monotonic()
        self.measure(report, skip)
        return report

    def measure(self, report: FaultReport, skip: Iterable[str] = ()) -> None:
        skip = set(skip)
        window = [s for s in self.sampler.series(report.started - 5.0) if s.at <= report.settled]
        leaderless_s, report.quorum_at = self.leaders.leaderless(report.started, report.settled)
        back, gap = publishing_back(window, report.started, skip, until=report.ended + 5.0)
        # Per worker, against its own count before the fault (a restarted worker counts from 0).
        uploads_before: dict[str, float] = {}
        upload_back: float | None = None
        for s in window:
            if s.worker in skip:
                continue
            if s.at < report.started:
                uploads_before[s.worker] = s.uploads
            elif s.uploads > uploads_before.get(s.worker, 0.0):
                upload_back = round(s.at - report.started, 2)
                break
        owned = first_after(report.started, lambda o: self._owned_in(o, skip),
                            self.sampler.ownership(report.started))
        report.measured.update({
            "stream_leaderless_s": leaderless_s,
            "publishing_back_s": round(back, 2),
            # Past the stream having a leader again: what the publisher itself adds.
            "publishing_after_leader_s": round(max(0.0, report.started + back - report.quorum_at), 2),
            "longest_ack_gap_s": round(gap, 2),
            "indexing_back_s": report.indexing_back_s,
            "clip_upload_back_s": upload_back,
            "ownership_back_s": None if owned is None else round(owned, 2),
            **readiness(window, skip),
            # Which of /readyz's checks said not-ready, in worker-samples (one is SAMPLE_EVERY_S).
            "failing_checks": dict(collections.Counter(
                name for s in window if s.at >= report.started and s.worker not in skip for name in s.failing)),
        })

    def _owned_in(self, listing: Ownership, dead: set[str]) -> bool:
        return all(sid in listing.owners and listing.owners[sid][1] == "live"
                   and listing.owners[sid][0] not in (None, *dead) for sid in self.streams)

    def node_fault(self, name: str, victim: ClusterNode, *, down_s: float, how: str = "kill",
                   down_until: Callable[[], bool] | None = None) -> FaultReport:
        """SIGKILL (`how="kill"`) or SIGSTOP (`"stop"`) one node for `down_s` (or, with
        `down_until`, until that holds, within `down_s`), then bring it back."""
        report = self.begin(name)
        report.notes.append(f"{how} {victim.name}")
        pid = victim.server.pid
        if how == "kill":
            victim.server.kill()
        else:
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
        if down_until is None:
            time.sleep(down_s)  # the fault's length is the schedule, not a condition
        else:
            self.wait(down_until, down_s, f"{name}: the condition to end it")
        if how == "kill":
            victim.server.restart()
        else:
            assert pid is not None
            os.kill(pid, signal.SIGCONT)
        self.cluster.wait_ready(60)
        report.ended = time.monotonic()
        return self.settle(report)

    def rolling_restart(self, pause_s: float = 5.0) -> FaultReport:
        report = self.begin("restart all three, one at a time")
        for node in self.cluster.nodes:
            node.server.restart()
            self.cluster.wait_ready(60)
            report.notes.append(f"{node.name} back at +{time.monotonic() - report.started:.1f} s")
            time.sleep(pause_s)
        report.ended = time.monotonic()
        return self.settle(report)

    def recording(self, holder: str, within_s: float = 120.0) -> str | None:
        """Waits until worker `holder` records a clip: an alert of a stream it runs has started and
        not ended, or ended less than the clip's `post_s` ago. That stream, or None if none did
        within `within_s`."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            now = time.monotonic()
            # alert -> (stream, when its clip stops recording: inf while the alert is open)
            cutting: dict[str | None, tuple[str, float]] = {}
            for e in self.recorder.snapshot()[-5000:]:
                if e.kind == "alerts" and e.node == holder:
                    if e.phase == "start":
                        cutting[e.alert_id] = (e.stream_id, float("inf"))
                    elif e.phase == "end":
                        cutting[e.alert_id] = (e.stream_id, e.at + CLIPS["post_s"])
            open_now = [sid for sid, until in cutting.values() if until > now + 0.2]
            if open_now:
                return open_now[0]
            time.sleep(0.1)
        return None

    def kill_indexing_worker(self) -> FaultReport:
        """SIGKILL the worker that holds the timeline lease, while it records a clip; start it again
        once its streams have moved."""
        holder = self.index_holder()
        if holder is None or holder not in self.fleet.workers:
            raise RuntimeError(f"no worker holds the timeline ({holder})")
        owned = [sid for sid, (owner, _) in self.sampler.ownership()[-1].owners.items() if owner == holder]
        if not owned:
            raise RuntimeError(f"{holder} indexes but owns no stream")
        recording = self.recording(holder)
        worker = self.fleet.workers[holder]
        report = self.begin(f"SIGKILL worker {holder} (timeline lease, recording)")
        worker.signal(signal.SIGKILL)
        report.notes.append(f"{holder} owned {owned}, " + (f"recording a clip of {recording}" if recording
                                                             else "recording no clip (none within 120 s)"))
        worker.serve.wait(10)
        self.wait(lambda: self._owned_in(self.sampler.ownership()[-1], {holder}), self.leases["lease_ttl_s"] + 30,
                  "the dead worker's streams live elsewhere")
        new_holder = None
        with contextlib.suppress(TimeoutError):
            self.wait(lambda: self.index_holder() not in (None, holder), self.leases["lease_ttl_s"] + 30,
                      "the timeline lease moved")
            new_holder = self.index_holder()
        report.notes.append(f"timeline now on {new_holder}")
        settled = self.settle(report, skip={holder})
        del self.fleet.workers[holder]
        self.fleet.start(holder, env={holder: self.env(holder)})
        return settled

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps({
            "samples": [dataclasses.asdict(s) for s in self.sampler.series()],
            "leaders": list(self.leaders.seen),
            "faults": [{"name": r.name, "started": r.started, "ended": r.ended, "settled": r.settled,
                        "quorum_at": r.quorum_at} for r in self.reports],
        }))

    # -- afterwards -------------------------------------------------------------------------

    def account(self, clips_checked: int = 60) -> dict[str, Any]:
        """Durable events lost and duplicated, overall and per fault window; markers in the index;
        every listed clip opened."""
        # Heard first, stored after: an event heard but not yet stored may still be in flight, so
        # the stream is read again (for up to 15 s) until it holds every one.
        heard = self.recorder.snapshot()
        durable = {e.ce_id: e for e in heard if e.kind in DURABLE_KINDS and e.node != "chaos-probe"}
        stored = collections.Counter(stored_ids(self.urls))
        deadline = time.monotonic() + 15.0
        while not durable.keys() <= stored.keys() and time.monotonic() < deadline:
            time.sleep(0.5)
            stored = collections.Counter(stored_ids(self.urls))
        lost = {i for i in durable if i not in stored}
        doubled = {i for i, n in stored.items() if n > 1}
        for report in self.reports:
            window = {i for i, e in durable.items() if report.started - 5 <= e.at <= report.settled}
            report.measured["lost"] = len(window & lost)
            report.measured["duplicated"] = len(window & doubled)
            report.measured["durable_in_window"] = len(window)
        markers = {}
        for word in self.probe.sent:
            hits = next((h for w in self.fleet.live() if (h := self.probe.hits(w, word)) is not None), None)
            markers[word] = None if hits is None else len(hits)
        return {
            "durable_heard": len(durable), "stored": sum(stored.values()), "lost": len(lost),
            "duplicated": len(doubled), "recorder_dropped": self.recorder.dropped,
            "lost_examples": [self._describe(durable[i]) for i in sorted(lost)[:10]],
            "markers_indexed_once": sum(n == 1 for n in markers.values()), "markers": len(markers),
            "clips": self.check_clips(clips_checked),
        }

    def _describe(self, e: Heard) -> str:
        """A heard event, with where it fell against the faults (for a loss to be looked into)."""
        near = min(self.reports, key=lambda r: abs(e.at - r.started), default=None)
        when = f"{e.at - near.started:+.1f} s from '{near.name}'" if near is not None else ""
        return f"{e.kind} {e.stream_id} from {e.node} {e.ce_id} {when}"

    def check_clips(self, limit: int) -> dict[str, Any]:
        worker = self.fleet.live()[0]
        status, body = http("GET", f"{worker.url}/api/clips", timeout=15)
        if status != 200:
            return {"error": f"{status} {body}"}
        listed = body["clips"][:limit]
        bad: list[str] = []
        for clip in listed:
            try:
                with urllib.request.urlopen(f"{worker.url}{clip['links']['mp4']}", timeout=30) as reply:
                    data = reply.read()
                path = self.root / "clip-check.mp4"
                path.write_bytes(data)
                with av.open(str(path)) as container:
                    frames = sum(1 for _ in container.decode(video=0))
                if frames == 0 or len(data) != clip["bytes"]:
                    bad.append(f"{clip['id']}: {frames} frames, {len(data)} of {clip['bytes']} bytes")
            except (OSError, urllib.error.URLError, av.error.FFmpegError) as exc:
                bad.append(f"{clip['id']}: {exc!r}")
        return {"listed": body.get("total"), "opened": len(listed) - len(bad), "bad": bad,
                "partial": bool(body.get("partial"))}

