"""The fleet's desired bucket is a trust boundary (issue 23): values written straight into it with
nats-py are held to the worker's `sources:` policy at claim time and before every connect; a
value under another key's id is logged; two workers with one `--node` do not both run.

Against a real nats-server (and, for the connect checks, a real RTSP server and real sockets)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from pipelines.frames import StatusChange, StreamState
from pipelines.mailbox import FrameMailbox
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.fleet.metrics import FleetCollector
from realtime.fleet.worker import DuplicateNode, FleetWorker
from realtime.leases.options import FleetOptions
from realtime.leases.records import desired_bucket, node_key
from realtime.sources import policy as policy_module
from realtime.sources.policy import SourcePolicy
from realtime.sources.spec import parse_source
from realtime.sources.supervisor import CameraSupervisor, SupervisorPolicy
from realtime.streams.registry import StreamRegistry
from tests.support.rtsp import RtspServer
from tests.support.serve_process import ServeProcess, http, write_config
from tests.support.waiting import poll, wait_until

FAST = SupervisorPolicy(backoff_initial=0.1, backoff_max=0.2, watchdog_s=1.0, stall_restart_s=2.0,
                        open_timeout_s=2.0, read_timeout_s=2.0, max_failed_connects=None)


def options(name: str, node: str, policy: SourcePolicy | None = None, **extra: Any) -> FleetOptions:
    return FleetOptions(name=name, node=node, capacity=8, lease_ttl_s=2.0, renew_interval_s=0.5,
                        source_policy=policy or SourcePolicy(), **extra)


def stub_registry() -> StreamRegistry:
    return StreamRegistry(lambda settings: None)  # type: ignore[arg-type, return-value]  # never reconciled


async def put_raw(nc: Any, fleet: str, key: str, body: dict[str, Any]) -> None:
    kv = await nc.jetstream().key_value(desired_bucket(fleet))
    await kv.put(key, json.dumps(body).encode())


def skipped_metric(worker: FleetWorker) -> dict[str, float]:
    """vidsentry_fleet_desired_values_skipped_total by `why`, as /metrics shows it."""
    return {sample.labels["why"]: sample.value for family in FleetCollector(worker).collect()
            for sample in family.samples if sample.name == "vidsentry_fleet_desired_values_skipped_total"}




def test_a_worker_does_not_claim_what_its_sources_policy_refuses(
    fleet_nats: EmbeddedNatsServer, small_clip: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "outside.mp4"
    outside.write_bytes(small_clip.read_bytes())  # exists, but not under local_dirs
    written = {
        "passwd": "file:///etc/passwd",
        "zero": "/dev/zero",
        "outside": str(outside),
        "missing": str(tmp_path / "no-such-file.mp4"),
        "outside-url": outside.as_uri(),
        "missing-url": (tmp_path / "no-such-file.mp4").as_uri(),
        "allowed": str(small_clip),
    }
    refused = sorted(sid for sid in written if sid != "allowed")
    policy = SourcePolicy(local_dirs=(small_clip.parent.resolve(),), allow_private_hosts=False)

    async def scenario() -> None:
        nc = await nats.connect(fleet_nats.url)
        worker = FleetWorker(options("trust", "n1", policy), stub_registry(), lambda: nc)
        try:
            await worker.start([])
            for key, url in written.items():
                await put_raw(nc, "trust", key, {"id": key, "url": url})
            run = asyncio.create_task(worker.run())
            await wait_until(lambda: "allowed" in worker.registry, 10, "the allowed stream is claimed")
            rounds = worker.counters.claim_rounds
            await wait_until(lambda: worker.counters.claim_rounds >= rounds + 3, 10, "three more claim rounds")
            assert [sid for sid in written if sid in worker.registry] == ["allowed"]
            assert worker.keeper is not None and worker.keeper.held() == ["allowed"]
            views = {v["id"]: v for v in worker.views()}
            assert sorted(views) == sorted(written)  # a missing file is listed like an existing one
            reasons = {sid: views[sid]["reason"] for sid in refused}
            assert all(v["owner"] is None and v["state"] == "pending" for sid, v in views.items() if sid != "allowed")
            assert all("may not open it" in r and "sources.local_dirs" in r for r in reasons.values()), reasons
            # Neither the reason nor the URL shown tells a file that exists from one that does not.
            assert len(set(reasons.values())) == 1, reasons
            assert all(views[sid]["url"] == written[sid] for sid in refused), views
            assert worker.desired.counts.refused == len(refused) and worker.desired.counts.skipped == 0
            refusals = [r for r in caplog.records if r.getMessage().startswith("desired stream refused")]
            assert sorted(vars(r)["stream_id"] for r in refusals) == refused
            assert not [r for r in caplog.records if "unreadable" in r.getMessage()]
            assert skipped_metric(worker) == {"policy": len(refused), "unreadable": 0}
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        finally:
            await worker.stop()
            await nc.close()

    with caplog.at_level(logging.INFO, logger="realtime.fleet.worker"):
        asyncio.run(scenario())


def test_a_value_under_another_keys_id_is_skipped_and_logged_once(
    fleet_nats: EmbeddedNatsServer, small_clip: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        nc = await nats.connect(fleet_nats.url)
        worker = FleetWorker(options("ids", "n1"), stub_registry(), lambda: nc)
        try:
            await worker.start([])
            await put_raw(nc, "ids", "cam", {"id": "other", "url": str(small_clip)})
            mirror = worker.membership.desired_mirror
            assert mirror is not None
            await wait_until(lambda: mirror.get("cam") is not None, 5, "seen")
            for _ in range(3):
                assert worker.views() == []
            assert worker.desired.counts.skipped == 1
            assert skipped_metric(worker) == {"policy": 0, "unreadable": 1}
        finally:
            await worker.stop()
            await nc.close()

    with caplog.at_level(logging.INFO, logger="realtime.fleet.worker"):
        asyncio.run(scenario())
    logged = [r for r in caplog.records if "under another key" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert vars(logged[0])["stream_id"] == "cam" and vars(logged[0])["value_id"] == "other"
    assert isinstance(vars(logged[0])["revision"], int)


def run_supervisor(url: str, admit: SourcePolicy | None) -> tuple[CameraSupervisor, list[StatusChange], StreamState]:
    async def go() -> tuple[CameraSupervisor, list[StatusChange], StreamState]:
        changes: list[StatusChange] = []
        supervisor = CameraSupervisor("cam", parse_source(url), video=FrameMailbox(), audio=None,
                                      on_status=changes.append, policy=FAST, untrusted=True, admit=admit)
        state = await asyncio.wait_for(supervisor.run(), 20)
        return supervisor, changes, state

    return asyncio.run(go())


def test_the_policy_is_checked_before_the_first_connect(live_rtsp: RtspServer) -> None:
    strict = SourcePolicy(allow_private_hosts=False)
    for url in (live_rtsp.url("/test"), "rtsp://169.254.169.254/"):
        supervisor, changes, state = run_supervisor(url, strict)
        assert state is StreamState.FAILED
        assert supervisor.stats.connect_attempts == 0 and supervisor.stats.refused_connects == 1
        assert changes[-1].reason is not None and changes[-1].reason.startswith("source not allowed: host ")


def test_the_policy_is_checked_again_before_every_reconnect(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the first connect fails, then a reconnect
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    answers = iter([["93.184.216.34"], ["127.0.0.1"]])  # DNS rebinding: public first, loopback next

    async def resolve(host: str, _port: int) -> list[Any]:
        import ipaddress

        return [ipaddress.ip_address(a) for a in next(answers)]

    monkeypatch.setattr(policy_module, "_resolve", resolve)
    supervisor, changes, state = run_supervisor(f"rtsp://camera.example:{port}/x", SourcePolicy())
    assert state is StreamState.FAILED
    assert supervisor.stats.connect_attempts == 1 and supervisor.stats.refused_connects == 1
    assert [c.state for c in changes][-2:] == [StreamState.CONNECTING, StreamState.FAILED]
    assert changes[-1].reason is not None and "camera.example" in changes[-1].reason


def test_a_second_worker_with_a_live_workers_node_name_refuses_to_join(
    fleet_nats: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        nc = await nats.connect(fleet_nats.url)
        first = FleetWorker(options("dup", "same"), stub_registry(), lambda: nc)
        try:
            await first.start([])
            run = asyncio.create_task(first.run())
            mirror = first.membership.lease_mirror
            assert mirror is not None
            await wait_until(lambda: mirror.get(node_key("same")) is not None, 10.0, "the first's node record")
            second = FleetWorker(options("dup", "same"), stub_registry(), lambda: nc)
            with pytest.raises(DuplicateNode, match="'same'"):
                await second.start([])
            # A crashed run's record (never renewed) only delays a start until it expires.
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            for task in first.membership._mirror_tasks:
                task.cancel()
            third = FleetWorker(options("dup", "same"), stub_registry(), lambda: nc)
            # Past this wait the check would let it join anyway (a missed expiry marker): so long a
            # wait that the start can only end because the record's expiry was seen.
            monkeypatch.setattr(third.membership, "stale_after", lambda: 3600.0)
            async with asyncio.timeout(60.0):  # a bound against hangs
                await third.start([])
            assert third.counters.duplicate_nodes == 0  # a crashed run of its own name is no duplicate
            await third.stop()
        finally:
            await nc.close()

    asyncio.run(scenario())


def test_serve_exits_2_naming_the_node_when_another_worker_runs_under_it(
    fleet_nats: EmbeddedNatsServer, nudenet_model: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "w.yaml", {
        "detector": {"model": str(nudenet_model), "engine": "onnx-cpu", "threads": 1},
        "captions": {"enabled": False},
        "fleet": {"name": "dupserve", "lease_ttl_s": 3.0, "renew_interval_s": 1.0},
    })
    args = ("--config", str(config), "--port", "0", "--nats-url", fleet_nats.url, "--node", "twin")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with ServeProcess(*args, log_dir=tmp_path / "a") as first:
        poll(lambda: http("GET", f"{first.url}/readyz")[0] == 200, 30, "first worker ready")
        second = ServeProcess(*args, log_dir=tmp_path / "b").start(wait_for_url=False)
        try:
            assert second.wait(60) == 2
        finally:
            second.kill()
        lines = [line for line in second.stderr().splitlines() if not line.startswith("{")]
        assert len(lines) == 1 and "'twin'" in lines[0] and "--node" in lines[0], second.stderr()[-2000:]
        assert http("GET", f"{first.url}/readyz")[0] == 200  # the first one kept running


def test_a_bucket_value_on_loopback_is_refused_by_a_worker_that_does_not_allow_private_hosts(
    fleet_nats: EmbeddedNatsServer, nudenet_model: Path, live_rtsp: RtspServer, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "w.yaml", {
        "detector": {"model": str(nudenet_model), "engine": "onnx-cpu", "threads": 1},
        "captions": {"enabled": False},
        "sources": {"allow_private_hosts": False},
        "fleet": {"name": "loop", "lease_ttl_s": 3.0, "renew_interval_s": 1.0},
    })
    args = ("--config", str(config), "--port", "0", "--nats-url", fleet_nats.url, "--node", "w0")
    with ServeProcess(*args, log_dir=tmp_path) as worker:
        poll(lambda: http("GET", f"{worker.url}/readyz")[0] == 200, 30, "worker ready")

        async def write() -> None:
            nc = await nats.connect(fleet_nats.url)
            try:
                await put_raw(nc, "loop", "cam", {"id": "cam", "url": live_rtsp.url("/test")})
            finally:
                await nc.close()

        asyncio.run(write())

        def state() -> dict[str, Any]:
            status, body = http("GET", f"{worker.url}/api/streams/cam")
            return body if status == 200 else {}

        seen: dict[str, Any] = {}

        def ended() -> bool:
            seen.update(state())
            return seen.get("state") in ("failed", "live")

        poll(ended, 30, "the stream ran or failed")
        assert seen["state"] == "failed" and seen["reason"].startswith("source not allowed: host 127.0.0.1"), seen
        assert seen["counters"]["connect_attempts"] == 0 and seen["counters"]["refused_connects"] >= 1
        assert http("GET", f"{worker.url}/api/streams/cam/frame.jpg")[0] == 404


def test_the_sample_nats_config_lets_workers_write_the_buckets_and_the_reader_only_read_them(
    tmp_path: Path,
) -> None:
    repo = Path(__file__).resolve().parents[3]
    sample = (repo / "deploy" / "nats-fleet-auth.conf").read_text()
    # The sample's users and permissions as shipped; EmbeddedNatsServer's flags give the address
    # (its `port` yields to them; a port taken before the bind is retried on another) and the
    # store, which nats-server will not take twice.
    shipped_store = 'jetstream { store_dir: "/var/lib/nats" }'
    assert shipped_store in sample
    (tmp_path / "nats.conf").write_text(sample.replace(shipped_store, "jetstream {}"))
    server = EmbeddedNatsServer(store_dir=tmp_path / "js", config_file=tmp_path / "nats.conf")
    port = server.start().port

    async def expected(_exc: Exception) -> None:  # connection refused while it starts; permission violations
        pass

    async def scenario() -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                worker_nc = await nats.connect(f"nats://worker:CHANGE-ME-worker@127.0.0.1:{port}",
                                               error_cb=expected, allow_reconnect=False)
                break
            except (OSError, nats.errors.Error):
                assert time.monotonic() < deadline, "the sample config's nats-server did not start"
                await asyncio.sleep(0.1)
        reader_nc = await nats.connect(f"nats://fleet-reader:CHANGE-ME-reader@127.0.0.1:{port}", error_cb=expected)
        worker = FleetWorker(options("site1", "n1"), stub_registry(), lambda: worker_nc)
        try:
            await worker.start([])  # creates both buckets and writes to them
            await put_raw(worker_nc, "site1", "cam", {"id": "cam", "url": "rtsp://camera.example/x"})
            run = asyncio.create_task(worker.run())  # writes its node record and claims the stream
            await wait_until(lambda: worker.keeper is not None and worker.keeper.held() == ["cam"], 15, "claimed")
            for bucket in (desired_bucket("site1"), desired_bucket("site1") + "-leases"):
                kv = await reader_nc.jetstream().key_value(bucket)
                assert await kv.keys()  # watching, listing and getting are allowed
                with pytest.raises((TimeoutError, nats.errors.Error)):
                    await asyncio.wait_for(kv.put("cam", b'{"id": "cam", "url": "/etc/passwd"}'), 0.5)
            assert [v["url"] for v in worker.views()] == ["rtsp://camera.example/x"]
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        finally:
            await worker.stop()
            await reader_nc.close()
            await worker_nc.close()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
