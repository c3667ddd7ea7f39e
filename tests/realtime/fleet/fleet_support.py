"""Several `vidsentry serve --fleet` workers on one nats-server, as processes, for the fleet
tests and bench/bench_fleet.py; and a recorder of the events they publish."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors

from realtime.bus import cloudevents
from realtime.bus.connection import round_trip
from tests.support.serve_process import ServeProcess, http, write_config
from tests.support.waiting import poll

# Short leases keep the tests quick: a dead worker's streams move within TTL + one renewal.
TEST_FLEET = {"lease_ttl_s": 3.0, "renew_interval_s": 1.0}
FAST_SUPERVISOR = {"backoff_initial_s": 0.2, "backoff_max_s": 1.0, "watchdog_s": 1.5, "stall_restart_s": 4.0,
                   "open_timeout_s": 3.0}


@dataclass
class Worker:
    name: str
    serve: ServeProcess

    @property
    def url(self) -> str:
        assert self.serve.url is not None
        return self.serve.url

    def streams(self) -> dict[str, dict[str, Any]]:
        status, body = http("GET", f"{self.url}/api/streams")
        assert status == 200, body
        return {s["id"]: s for s in body["streams"]}

    def alive(self) -> bool:
        return self.serve.proc is not None and self.serve.proc.poll() is None

    def signal(self, signum: int) -> None:
        assert self.serve.proc is not None
        self.serve.proc.send_signal(signum)


class Fleet:
    """Workers w0, w1, ... in fleet `name`, each with its own log directory."""

    def __init__(self, nats_url: str, model: Path, root: Path, *, name: str = "t", fleet: dict[str, Any] | None = None,
                 capacity: int = 8, local_dirs: list[Path] | None = None, extra: dict[str, Any] | None = None) -> None:
        self.nats_url = nats_url
        self.root = root
        self.name = name
        self.config = write_config(root / "fleet.yaml", {
            "detector": {"model": str(model), "engine": "onnx-cpu", "threads": 1},
            "supervisor": FAST_SUPERVISOR,
            "captions": {"enabled": False},
            "sources": {"allow_local_hosts": True, "local_dirs": [str(d) for d in local_dirs or []]},
            "http": {"max_streams": 600, "shutdown_timeout_s": 5},
            "fleet": {"name": name, "capacity": capacity, **(fleet or TEST_FLEET)},
            **(extra or {}),
        })
        self.workers: dict[str, Worker] = {}
        self._starts = 0

    def start(self, *names: str, env: dict[str, dict[str, str]] | None = None) -> list[Worker]:
        """Start workers `names`; `env`: settings of one worker's own by name (VIDSENTRY_... overrides)."""
        procs = []
        for name in names:
            self._starts += 1
            log_dir = self.root / f"{name}-{self._starts}"
            log_dir.mkdir(parents=True, exist_ok=True)
            serve = ServeProcess("--config", str(self.config), "--port", "0", "--nats-url", self.nats_url,
                                 "--node", name, log_dir=log_dir, env=(env or {}).get(name))
            serve.start(wait_for_url=False)
            procs.append(Worker(name, serve))
        for worker in procs:  # started side by side: model loading overlaps
            worker.serve.url = worker.serve._wait_for_url(90)
            poll(lambda w=worker: http("GET", f"{w.url}/readyz")[0] == 200, 30, f"{worker.name} ready")
            self.workers[worker.name] = worker
        return procs

    def story(self, *messages: str, limit: int = 40) -> str:
        """The workers' log lines whose message is one of `messages`, oldest first per worker: what a
        failed assertion needs to say why a lease was lost or a stream moved."""
        lines = []
        for log_path in sorted(self.root.glob("*/serve.log")):
            for line in log_path.read_text(errors="replace").splitlines():
                if any(f'"msg": "{message}' in line for message in messages):
                    lines.append(f"{log_path.parent.name}: {line}")
        return "\n".join(lines[-limit:])

    def live(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.alive()]

    def stop_all(self) -> None:
        for worker in self.workers.values():
            if worker.alive():
                worker.signal(signal.SIGCONT)
                worker.signal(signal.SIGTERM)
        for worker in self.workers.values():
            try:
                worker.serve.wait(30)
            except Exception:
                worker.serve.kill()
        self.workers.clear()

    def kill_all(self) -> None:
        for worker in self.workers.values():
            worker.signal(signal.SIGCONT) if worker.alive() else None
            worker.serve.kill()
        self.workers.clear()


@dataclass(frozen=True, slots=True)
class Seen:
    at: float  # time.monotonic() here
    stream_id: str
    kind: str
    node: str
    lease: int | None
    ce_id: str
    state: str | None
    published_at: float | None = None  # the body's published_at (time.time() there): when it passed the fence


@dataclass
class EventRecorder:
    """Every event on `vidsentry.>` with the node (from ce-source) and lease revision, in a thread."""

    url: str
    events: list[Seen] = field(default_factory=list)
    max_events: int = 200_000

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> EventRecorder:
        self._thread.start()
        assert self._ready.wait(10), "recorder did not subscribe"
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def snapshot(self) -> list[Seen]:
        with self._lock:
            return list(self.events)

    def detections_since(self, since: float, streams: list[str], count: int = 1) -> list[Seen] | None:
        """The detections events published after `since` (time.time(), judged by their own
        published_at, not by when they got here), once each of `streams` has `count` of them;
        None until then (for `poll`)."""
        seen = [e for e in self.snapshot() if e.kind == "detections" and (e.published_at or 0.0) > since]
        ready = all(sum(e.stream_id == sid for e in seen) >= count for sid in streams)
        return seen if ready else None

    async def _run(self) -> None:
        nc = await nats.connect(self.url)

        async def take(msg: Any) -> None:
            headers = msg.headers or {}
            source = headers.get("ce-source", "")
            parts = source.split("/")
            lease = headers.get(cloudevents.LEASE_HEADER)
            kind = msg.subject.split(".")[-1]
            state, published_at = None, None
            with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
                body = json.loads(msg.data)
                state = body.get("state") if kind == "status" else None
                published_at = cloudevents.parse_rfc3339(body["published_at"]).timestamp()
            seen = Seen(time.monotonic(), parts[-1] if parts else "", kind, parts[2] if len(parts) > 3 else "",
                        int(lease) if lease else None, headers.get("ce-id", ""), state, published_at)
            with self._lock:
                if len(self.events) < self.max_events:
                    self.events.append(seen)

        await nc.subscribe("vidsentry.>", cb=take)
        await round_trip(nc)
        self._ready.set()
        await asyncio.to_thread(self._stop.wait)
        await nc.drain()
