"""Clips through the real stream graph: the sample clip (H.264 + AAC) → StreamRunner with the real
model, tracker and a `present` rule → an alert → a clip remuxed from the stream's own packets:
the MP4 opens, starts at a keyframe at or before the alert's start − pre_s, covers the alert, and
a `clips` event says where it is. Plus the store's bounds and what a crash leaves behind."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import av
import numpy as np

from pipelines.clips.config import ClipsSettings
from pipelines.clips.engine import CLIPS, ClipEngine
from pipelines.clips.ring import PacketRing
from pipelines.clips.stage import ClipStage, webvtt
from pipelines.clips.store import ClipStore, StreamBounds
from pipelines.detect import DetectionBatcher
from pipelines.event_bodies import alert_event, description_event
from pipelines.events import Event, EventKind
from pipelines.frames import StreamState
from pipelines.graph import SharedEngines
from pipelines.mailbox import FrameMailbox
from pipelines.rules.types import AlertChange, AlertEventKind
from realtime.streams.runner import StreamRunner
from tests.support.rtsp import RtspServer
from tests.support.sinks import ListSink
from tests.support.stage import stage_context, stage_spec
from tests.support.streams import camera_spec


async def test_an_alert_on_a_stream_leaves_a_clip_of_its_own_packets_around_it(
    sample_clip: Path, fall_batcher: DetectionBatcher, tmp_path: Path
) -> None:
    settings = ClipsSettings(enabled=True, dir=tmp_path / "clips", pre_s=2.0, post_s=1.0)
    store = ClipStore(settings.dir, settings.max_total_bytes, settings.max_age_s)
    store.open()
    spec = camera_spec("plaza", str(sample_clip), audio=False,
                       rules=[{"id": "people", "type": "present", "classes": ["Normal"], "for_s": 3.0}])
    sink = ListSink()
    runner = StreamRunner(spec, SharedEngines(fall_batcher, opened={CLIPS.name: ClipEngine(store, settings)}), sink)
    task = asyncio.create_task(runner.run())
    deadline = time.monotonic() + 60
    while runner.frame_loop is None or runner.frame_loop.stats.frames_processed < 60:
        assert time.monotonic() < deadline and not task.done(), "the stream did not get going"
        await asyncio.sleep(0.05)
    runner.stop()  # the open alert ends with the stream; its clip is cut from what the buffer holds
    assert await asyncio.wait_for(task, 30) is StreamState.STOPPED

    (start,) = [e for e in sink.kinds(EventKind.ALERTS) if e.data["event"] == "start"]
    (clip_event,) = sink.kinds(EventKind.CLIPS)
    body = clip_event.data
    assert body["alert_ids"] == [start.data["alert_id"]] and clip_event.stream_id == "plaza"
    assert body["links"]["mp4"] == f"/api/clips/{body['clip_id']}.mp4"
    assert body["codec"] == "h264" and (body["width"], body["height"]) == (768, 576)
    # From the keyframe at or before start − pre_s (the sample has one every second).
    wanted = start.data["started_pts"] - settings.pre_s
    assert wanted - 1.0 < body["start_pts"] <= wanted + 1e-6
    assert body["end_pts"] >= start.data["started_pts"]

    path = store.path(body["clip_id"])
    assert path is not None and path.stat().st_size == body["bytes"]
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["clip_id"] == body["clip_id"] and sidecar["alert_ids"] == body["alert_ids"]
    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
    assert frames[0].key_frame and frames[0].time == 0.0
    assert abs(frames[-1].time + 0.1 - body["duration_s"]) < 0.11  # 10 fps: within a frame
    # Every frame's boxes beside it, on the clip's time: each at a frame of the MP4.
    assert body["links"]["boxes"] == f"/api/clips/{body['clip_id']}.json" and "vtt" not in body["links"]
    boxes = json.loads(store.extra(body["clip_id"], ".boxes.json").read_text())  # type: ignore[union-attr]
    times = {round(f.time, 3) for f in frames}
    assert boxes["frames"] and {f["t"] for f in boxes["frames"]} <= times
    assert any(o["class"] == "Normal" and o["track_id"] is not None for f in boxes["frames"] for o in f["objects"])
    assert all(abs(f["pts"] - f["t"] - body["start_pts"]) < 1e-3 for f in boxes["frames"])
    counters = runner.counters()
    assert counters["clips"] == 1 and counters["clip_packets"] > 0 and counters["clips_missed"] == 0
    # The alert's package: its start and end, evidence and all, on the clip's time.
    assert body["links"]["events"] == f"/api/clips/{body['clip_id']}.events.json"
    said = json.loads(store.extra(body["clip_id"], ".events.json").read_text())  # type: ignore[union-attr]
    # (The stream stopped with the alert open: its end and the last cut race, so the end may be missing.)
    seen = [(a["event"], a["alert_id"]) for a in said["alerts"]]
    assert seen in ([("start", start.data["alert_id"])], [("start", start.data["alert_id"]),
                                                          ("end", start.data["alert_id"])]), seen
    assert said["alerts"][0]["evidence"] == start.data["evidence"] and said["alerts"][0]["rule_id"] == "people"
    assert abs(said["alerts"][0]["t"] - (start.pts - body["start_pts"])) < 1e-3 and said["descriptions"] == []

    # Redacted on request: Fall boxes pixelated, the alert's own (Normal) tracks left as they are.
    info = store.get(body["clip_id"])
    assert info is not None and set(info.alert_tracks) == set(start.data["track_ids"])
    copy = store.redact(info, "d" * 32, ["Fall"])
    assert copy.redacted is not None and copy.redacted["classes"] == ["Fall"] and copy.redacted["regions"] > 0
    assert copy.redacted["kept_tracks"] == sorted(info.alert_tracks) and copy.redacted["source"] == info.id
    with av.open(str(store.path(copy.id))) as container:
        redacted = list(container.decode(video=0))
    assert len(redacted) == len(frames) and [f.time for f in redacted] == [f.time for f in frames]
    shown = next(f for f in boxes["frames"] if any(o["class"] == "Fall" for o in f["objects"])
                 and any(o["track_id"] in info.alert_tracks for o in f["objects"]))
    index = [round(f.time, 3) for f in frames].index(shown["t"])
    before, after = (f.to_ndarray(format="gray").astype(float) for f in (frames[index], redacted[index]))
    fall = next(o for o in shown["objects"] if o["class"] == "Fall")
    kept = next(o for o in shown["objects"] if o["track_id"] in info.alert_tracks)
    assert blockiness(after, fall["box"]) < 0.5 * blockiness(before, fall["box"])  # a mosaic now
    assert blockiness(after, kept["box"]) > 0.7 * blockiness(before, kept["box"])  # left readable


def blockiness(image: np.ndarray, box: list[float], block: int = 16) -> float:
    """Mean spread of the pixels inside each block of the box (blocks from its corner): a mosaic has none."""
    x1, y1, x2, y2 = (int(v) for v in box)
    region = image[max(0, y1):y2, max(0, x1):x2]
    spreads = [region[y:y + block, x:x + block].std() for y in range(0, region.shape[0] - block + 1, block)
               for x in range(0, region.shape[1] - block + 1, block)]
    return float(np.mean(spreads))


def write_clip(store: ClipStore, clip_id: str, size: int, created_at: float, stream_id: str = "cam") -> None:
    """A clip as the store indexes it (the bytes are not video: retention only reads sizes)."""
    (store.directory / f"{clip_id}.mp4").write_bytes(bytes(size))
    (store.directory / f"{clip_id}.json").write_text(json.dumps({
        "clip_id": clip_id, "stream_id": stream_id, "start_pts": 0.0, "end_pts": 1.0, "duration_s": 1.0,
        "bytes": size, "codec": "h264", "width": 2, "height": 2, "alert_ids": [], "created_at": created_at,
    }))


def test_the_store_removes_half_written_clips_and_keeps_to_its_bytes_and_age(tmp_path: Path) -> None:
    store = ClipStore(tmp_path, max_total_bytes=2_500, max_age_s=3600)
    now = time.time()
    for i, age in enumerate((5000, 300, 200, 100)):
        write_clip(store, f"{i:032x}", 1000, now - age)
    (tmp_path / f".{'a' * 32}.mp4.part").write_bytes(b"half")  # a crash mid-write
    (tmp_path / f"{'b' * 32}.mp4").write_bytes(b"no sidecar")  # a crash before the sidecar
    store.open()
    assert store.stats.removed_partial == 2
    # The one past max_age goes, then the oldest while the total is past 2,500 bytes.
    assert [c.id for c in store.list()] == [f"{2:032x}", f"{3:032x}"]
    assert (store.stats.evicted_age, store.stats.evicted_bytes) == (1, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{i:032x}{suffix}" for i in (2, 3) for suffix in (".json", ".mp4"))
    assert store.path("../../etc/passwd") is None and store.path(f"{0:032x}") is None
    assert store.delete(f"{2:032x}") and not store.delete(f"{2:032x}")
    assert [c.id for c in store.list()] == [f"{3:032x}"]


def test_a_stream_with_bounds_of_its_own_keeps_to_them_before_the_totals(tmp_path: Path) -> None:
    settings = ClipsSettings.model_validate({"streams": {"door": {"max_bytes": 2 * 1024 * 1024, "max_age_s": 250},
                                                         "yard": {"redact": ["person"]}}})
    bounds = {s: StreamBounds(own.max_bytes, own.max_age_s) for s, own in settings.streams.items()}
    store = ClipStore(tmp_path, max_total_bytes=10 * 1024 * 1024, max_age_s=3600, streams=bounds)
    now = time.time()
    mib = 1024 * 1024
    # door: one past its own age, then three of 1 MiB where its bound holds two; yard: old but within 3600 s.
    for i, (stream, age) in enumerate((("door", 300), ("door", 200), ("door", 100), ("door", 50),
                                       ("yard", 3000), ("yard", 100))):
        write_clip(store, f"{i:032x}", mib, now - age, stream_id=stream)
    store.open()
    assert [c.id for c in store.list("door")] == [f"{2:032x}", f"{3:032x}"]
    assert [c.id for c in store.list("yard")] == [f"{4:032x}", f"{5:032x}"]
    assert (store.stats.evicted_stream_age, store.stats.evicted_stream_bytes) == (1, 1)
    assert (store.stats.evicted_age, store.stats.evicted_bytes) == (0, 0)
    assert not (tmp_path / f"{0:032x}.mp4").exists() and not (tmp_path / f"{1:032x}.json").exists()
    assert settings.redact_for("yard") == ("person",) and settings.redact_for("door") == ()


def test_a_clip_the_disk_refuses_is_counted_and_leaves_nothing(sample_clip: Path, tmp_path: Path) -> None:
    from tests.engines.media.test_remux import demux

    store = ClipStore(tmp_path / "gone", max_total_bytes=10**9, max_age_s=3600)
    store.open()
    (tmp_path / "gone").rmdir()  # the directory vanished (an unmounted disk)
    packets = demux(str(sample_clip))[:20]
    assert store.write("c" * 32, "cam", [(0.0, p) for p in packets], []) is None
    assert store.stats.failed == 1 and len(store) == 0


def test_captions_become_webvtt_on_the_clips_time() -> None:
    text = webvtt([(0.5, 2.25, "Hello there."), (3661.0, 3662.5, "a --> b")]).decode()
    assert text == ("WEBVTT\n\n00:00:00.500 --> 00:00:02.250\nHello there.\n\n"
                    "01:01:01.000 --> 01:01:02.500\na -> b\n")


async def test_a_stream_with_clips_off_keeps_no_packets(tmp_path: Path) -> None:
    from pipelines.clips.stage import STAGE_NAME, build

    settings = ClipsSettings(enabled=True, dir=tmp_path)
    engines = SharedEngines(None, opened={CLIPS.name: ClipEngine(ClipStore(tmp_path, 10**9, 3600), settings)})  # type: ignore[arg-type]
    on = stage_context(engines)
    assert build(on) is not None and on.packet_input is not None  # the source will hand it packets
    off = stage_context(engines, stage_spec(off=frozenset({STAGE_NAME})))
    assert build(off) is None and off.packet_input is None


async def test_a_clips_package_holds_the_descriptions_and_alerts_of_its_span(tmp_path: Path) -> None:
    settings = ClipsSettings(enabled=True, dir=tmp_path / "clips")
    store = ClipStore(settings.dir, settings.max_total_bytes, settings.max_age_s)
    stage = ClipStage("cam", ClipEngine(store, settings), PacketRing(max_s=60.0, max_bytes=1 << 20),
                      FrameMailbox(asyncio.get_running_loop()), ListSink())
    for start, end, text in ((0.0, 4.0, "before the clip"), (8.0, 12.0, "a van stops"), (14.0, 18.0, "it leaves")):
        stage.observe(description_event("cam", text=text, fields={"people": 1}, window_start_pts=start,
                                        window_end_pts=end, frames=4, epoch=1, prompt_tokens=10, cached_tokens=5,
                                        latency_ms=1.0, model="sim", captured_at=time.time()))
    def started(alert_id: str, rule_type: str, pts: float, evidence: dict[str, str], snapshot: str | None) -> Event:
        change = AlertChange(AlertEventKind.START, alert_id, f"rule-{alert_id}", rule_type, "warning", (), None,
                             evidence, started_pts=pts, pts=pts)
        return alert_event("cam", change, captured_at=time.time(), snapshot=snapshot)

    long_ago = started("a1", "vlm", 2.0, {"trigger": "vlm", "question": "Is a van parked?",
                                          "reason": "a white van at the kerb"}, "snap-1")
    other = started("a2", "zone", 30.0, {}, None)
    stage.observe(long_ago)
    stage.observe(other)
    said = json.loads(stage._events(10.0, 20.0, ["a1"]) or b"{}")
    assert [d["text"] for d in said["descriptions"]] == ["a van stops", "it leaves"]
    assert [d["t"] for d in said["descriptions"]] == [2.0, 8.0]  # on the clip's time: its window's end
    (alert,) = said["alerts"]  # the one it was cut for, though it started before; not the later one
    assert alert["alert_id"] == "a1" and alert["t"] == -8.0 and alert["evidence"]["reason"] == "a white van at the kerb"
    assert alert["snapshot"] == "snap-1"
    assert stage._events(40.0, 50.0, []) is None


async def test_a_camera_read_by_gstreamer_gets_clips_from_its_frames_encoded_here(
    rtsp_server: RtspServer, fall_batcher: DetectionBatcher, tmp_path: Path
) -> None:
    """GStreamer decodes inside its pipeline and hands no packets: the clips stage encodes the
    frames itself, so such a camera's spans are exported like any other's."""
    settings = ClipsSettings(enabled=True, dir=tmp_path / "clips")
    store = ClipStore(settings.dir, settings.max_total_bytes, settings.max_age_s)
    store.open()
    spec = camera_spec("gst", rtsp_server.url("/test"), audio=False, ingest="gstreamer")
    runner = StreamRunner(spec, SharedEngines(fall_batcher, opened={CLIPS.name: ClipEngine(store, settings)}),
                          ListSink())
    task = asyncio.create_task(runner.run())
    try:
        deadline = time.monotonic() + 60
        while runner.counters()["clip_frames_encoded"] < 40:
            assert time.monotonic() < deadline and not task.done(), runner.counters()
            await asyncio.sleep(0.1)
        stage = runner.graph.stage("clips") if runner.graph is not None else None
        assert isinstance(stage, ClipStage) and stage.encoder is not None
        newest = stage.ring.newest_t
        assert newest is not None
        info = await stage.export(max(0.0, newest - 2.0), newest)
    finally:
        runner.stop()
        await asyncio.wait_for(task, 30)
    path = store.path(info.id)
    assert path is not None and info.codec == "h264"
    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
    assert frames[0].key_frame and len(frames) >= 10
    assert (frames[0].width, frames[0].height) == (info.width, info.height)
