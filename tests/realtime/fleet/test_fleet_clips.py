"""Clips in a fleet of two `vidsentry serve` processes on one real nats-server: the worker that runs
a camera records its alert clips and uploads each to the fleet's bucket; the other lists and serves
them (fetched from the bucket into its own store). The recording worker is SIGKILLed in the middle
of a clip: every clip it had finished is still listed and served whole by the survivor, nothing
half-written is ever listed, and the survivor, taking the camera over, records the next ones."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import pytest

from realtime.bus.embedded import EmbeddedNatsServer
from tests.realtime.fleet.fleet_support import TEST_FLEET, Fleet, Worker, http, poll

pytestmark = pytest.mark.slow

TTL = TEST_FLEET["lease_ttl_s"]
CLIPS = {"enabled": True, "pre_s": 1.0, "post_s": 1.0, "max_s": 4.0, "buffer_s": 20.0}


@pytest.fixture(scope="module")
def fleet(fleet_nats: EmbeddedNatsServer, fall_model: Path, sample_clip: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("clips-fleet")
    fleet = Fleet(fleet_nats.url, fall_model, root, name="cl", local_dirs=[sample_clip.parent],
                  extra={"clips": CLIPS, "timeline": {"enabled": False}})
    try:  # each worker its own disk, as on two machines
        fleet.start("w0", "w1", env={name: {"VIDSENTRY_CLIPS__DIR": str(root / f"{name}-clips")}
                                     for name in ("w0", "w1")})
        yield fleet
    finally:
        fleet.kill_all()


def clips(worker: Worker) -> list[dict[str, Any]]:
    status, body = http("GET", f"{worker.url}/api/clips?stream=cam")
    assert status == 200, body
    assert not body.get("partial"), body  # the bucket answered
    return list(body["clips"])


def get_bytes(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def download(worker: Worker, clip: dict[str, Any], into: Path) -> list[av.VideoFrame]:
    status, data = get_bytes(f"{worker.url}{clip['links']['mp4']}")
    assert status == 200 and len(data) == clip["bytes"], (status, clip, data[:200])
    into.write_bytes(data)
    with av.open(str(into)) as container:
        return list(container.decode(video=0))


def runner_of(fleet: Fleet) -> Worker | None:
    """The live worker that owns the camera, once it is live there."""
    for worker in fleet.live():
        stream = worker.streams().get("cam", {})
        if stream.get("owner") == worker.name and stream.get("state") == "live":
            return worker
    return None


def test_any_worker_serves_any_clip_and_a_killed_recorder_loses_none_it_had_finished(
    fleet: Fleet, sample_clip: Path, tmp_path: Path
) -> None:
    w0, w1 = fleet.workers["w0"], fleet.workers["w1"]
    body = {"id": "cam", "url": str(sample_clip), "audio": False, "realtime": True,
            "rules": [{"id": "people", "type": "present", "classes": ["Normal"], "for_s": 0.5}]}
    status, reply = http("POST", f"{w0.url}/api/streams", body)
    assert status == 201, reply
    poll(lambda: runner_of(fleet) is not None, 30, "a worker to run the camera")
    recorder = runner_of(fleet)
    assert recorder is not None
    other = w1 if recorder is w0 else w0

    # People are always in the picture: the alert stays open and a clip is cut every max_s (4 s).
    poll(lambda: len(clips(other)) >= 2, 60, f"{other.name} to list two clips {recorder.name} recorded")
    listed = clips(other)
    first = listed[-1]  # oldest
    frames = download(other, first, tmp_path / "first.mp4")  # fetched from the bucket, then served here
    assert frames[0].key_frame and frames[0].time == 0.0 and len(frames) >= 20
    status, boxes = http("GET", f"{other.url}{first['links']['boxes']}")
    assert status == 200 and boxes["frames"] and boxes["stream_id"] == "cam"
    status, ranged = get_bytes(f"{other.url}{first['links']['mp4']}", {"Range": "bytes=0-99"})
    assert status == 206 and len(ranged) == 100

    # A clip cut on request through the worker that does not run the camera: forwarded to the one
    # that does (its buffer), uploaded, and served at once by the worker that was asked.
    # A span the owner's buffer (20 s) still holds however long the stream has run by now: just
    # before the end of the newest clip listed.
    newest_end = float(clips(other)[0]["end_pts"])
    start, end = max(0.0, newest_end - 3.0), max(2.0, newest_end - 1.0)
    status, made = http("POST", f"{other.url}/api/streams/cam/clips", {"start": start, "end": end})
    assert status == 201 and made["start_pts"] <= start and made["end_pts"] >= end - 0.1, made
    frames = download(other, made, tmp_path / "forwarded.mp4")
    assert frames[0].key_frame and len(frames) >= 15
    status, refused = http("POST", f"{other.url}/api/streams/cam/clips", {"start": 1000, "end": 1001})
    assert status == 409 and "not in the stream's buffer" in refused["error"], refused  # the owner's reason
    # A picture from the buffer is for the worker that holds the video: it is named.
    status, refused = http("GET", f"{other.url}/api/streams/cam/frame.jpg?pts=1")
    assert status == 409 and refused["detail"]["owner"] == recorder.name, refused
    assert f"runs on worker {recorder.name}" in refused["error"]
    status, _ = http("POST", f"{other.url}/api/streams/nope/clips", {"start": 0, "end": 1})
    assert status == 404

    # Killed in the middle of its next clip (the alert is open, its window is growing).
    before = {c["clip_id"] for c in clips(other)}
    recorder.serve.kill()
    killed_at = time.time()
    after = clips(other)
    assert before <= {c["clip_id"] for c in after}  # nothing it had finished (and uploaded) is lost
    for index, clip in enumerate(after):  # and nothing listed is half-written: each one plays whole
        played = download(other, clip, tmp_path / f"after-{index}.mp4")
        assert played[0].key_frame and abs(played[-1].time - clip["duration_s"]) < 0.2, clip

    # The survivor takes the camera over within the lease TTL and records the next clips itself.
    poll(lambda: runner_of(fleet) is other, TTL + 30, f"{other.name} to take the camera over")
    # Counted by when each was made, not by how many are listed: one the killed recorder had
    # finished may be listed late.
    poll(lambda: any(c["created_at"] > killed_at for c in clips(other)), 60, "a clip recorded after the takeover")
    newest = clips(other)[0]
    assert newest["clip_id"] not in before and newest["created_at"] > killed_at
    status, metrics = get_bytes(f"{other.url}/metrics")
    adopted = [line for line in metrics.decode().splitlines() if line.startswith("vidsentry_fleet_clips_adopted_total")]
    assert status == 200 and float(adopted[0].split()[-1]) >= len(after)  # each served from the bucket
