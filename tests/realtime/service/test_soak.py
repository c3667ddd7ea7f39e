"""The soak's short version: a minute of the whole load on real parts (bench/soak.py is the long run).

Three RTSP cameras with audio (one talking, one whose server is killed and comes back, one that
changes its picture size), a browser peer that comes and goes, clips, the timeline, descriptions,
rules that fire, event readers and questions, against a real `vidsentry serve` and nats-server.
What it holds is what the long run's targets are about, minus the slopes a minute cannot show:
no durable event lost or stored twice, every listed clip decodes, every caption reaches the index,
nothing crashed or restarted, the camera that dropped came back, and the service stayed ready.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.load import LoadPlan
from tests.support.soak import run_soak, targets

pytestmark = pytest.mark.slow

LOAD_S = 60.0


def test_a_minute_of_everything_at_once_loses_nothing_and_breaks_nothing(sample_clip: Path, tmp_path: Path) -> None:
    plan = LoadPlan(cameras=3, peers=1, seconds=LOAD_S + 60, flap_every_s=20, flap_down_s=4, resize_every_s=12,
                    peer_on_s=(25, 30), peer_off_s=(2, 3), ask_every_s=20, peer_fps=10)
    # A crowd alert can stay open all minute where the detector keeps up: a clip is cut at 20 s so
    # one is finished and listed however busy the machine is.
    clips = {"clips": {"max_s": 20.0, "post_s": 2.0}}
    result = asyncio.run(run_soak(plan, tmp_path, seconds=LOAD_S, interval_s=5, config_sections=clips))
    found = targets(result)

    assert result.events["counts_logged"], "serve logged no per-kind counts when it stopped"
    assert (found["lost"], found["duplicated"]) == (0, 0), result.events["kinds"]
    stored = sum(k["stored"] for k in result.events["kinds"].values())
    assert stored > 0

    assert result.clips["listed"] > 0, ("no clip listed in a minute of vtest's pedestrians", result.events["kinds"])
    assert result.clips["bad"] == [], result.clips
    assert result.index["captions"] > 0, "the talking camera gave no caption"
    assert result.index["missing"] == 0, result.index

    assert result.serve["exit_code"] == 0
    assert (found["stream_restarts"], found["task_crashes"]) == (0, 0)
    assert result.serve["tracebacks"] == 0, result.serve["error_messages"]
    assert found["not_ready_samples"] == 0, [s["ready"] for s in result.samples]

    final = {s["id"]: s for s in result.serve["final_streams"]}
    assert result.load["flaps"] >= 1
    assert final["flaky"]["counters"]["reconnects"] >= 1, "the dropped camera never came back"
    assert final["flaky"]["state"] == "live"
    assert final["resize"]["state"] == "live"
    last = result.samples[-1]["streams"]
    assert last["resize"]["in_fps"] and last["resize"]["in_fps"] > 0, "the resizing camera stopped delivering"
    assert result.load["peer_sessions"] >= 1
    assert sum(result.load["channel_messages"].values()) > 0, "the peer's DataChannel carried nothing"
    assert sum(result.load["sse_events"].values()) > 0
    assert result.load["asks"].get("200", 0) >= 1, result.load["asks"]
