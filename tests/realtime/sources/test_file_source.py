"""Files through the supervisor, both backends, real decoding of the sample clip."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from pathlib import Path

import av
import numpy as np
import pytest

from pipelines.frames import AudioChunk, StreamState
from pipelines.mailbox import AudioBuffer, FrameMailbox
from realtime.sources import CameraSupervisor, parse_source
from tests.realtime.sources.util import (
    FAST_POLICY,
    STEADY_POLICY,
    FrameLog,
    StatusLog,
    drain_audio,
    drain_frames,
    play_file,
    strictly_increasing,
)

CLIP_FRAMES = 795  # 79.5 s at 10 fps
NARRATION_S = 50.1  # the AAC track: espeak narration, 16 kHz mono


async def test_whole_file_loses_nothing(backend: str, sample_clip: Path) -> None:
    """As fast as possible with a blocking mailbox: every frame and all the audio arrive."""
    play = await play_file(sample_clip, backend)
    state, status, supervisor, frames, chunks, mailbox, audio = (
        play.state, play.status, play.supervisor, play.frames, play.chunks, play.mailbox, play.audio
    )
    assert audio is not None
    assert state is StreamState.STOPPED
    assert status.states == [StreamState.CONNECTING, StreamState.LIVE, StreamState.STOPPED]
    assert status.events[-1].reason == "end of file"
    assert status.threads == {threading.get_ident()}  # on_status runs on the event loop thread
    assert frames.seqs == list(range(CLIP_FRAMES))
    assert strictly_increasing(frames.pts) and frames.pts[0] == pytest.approx(0.0, abs=0.01)
    assert frames.pts[-1] == pytest.approx(79.4, abs=0.05)
    assert frames.shapes == {(576, 768, 3)} and frames.dtypes == {"uint8"}
    # Read as fast as it goes, every frame will be measured: each arrives converted, on the reader's
    # thread (a live source's frames arrive unconverted: test_rtsp_source).
    assert frames.deferred == 0
    assert (mailbox.stats.put, mailbox.stats.taken, mailbox.stats.dropped) == (CLIP_FRAMES, CLIP_FRAMES, 0)

    assert all(c.samples.dtype == np.float32 and c.samples.ndim == 1 and c.sample_rate == 16_000 for c in chunks)
    assert sum(c.duration for c in chunks) == pytest.approx(NARRATION_S, abs=0.5)
    assert strictly_increasing([c.pts for c in chunks])
    assert max(float(np.abs(c.samples).max()) for c in chunks) <= 1.0
    assert audio.stats.chunks_dropped == 0
    stats = supervisor.stats
    assert (stats.frames, stats.connects, stats.reconnects, stats.corrupt_packets) == (CLIP_FRAMES, 1, 0, 0)
    assert stats.audio_seconds == pytest.approx(NARRATION_S, abs=0.5)


async def test_realtime_pacing_plays_like_a_camera(backend: str, sample_clip: Path) -> None:
    """--realtime: 30 frames (3 s of media) take about 3 s, and audio keeps pace with video."""
    mailbox = FrameMailbox()  # lossy, like a live camera
    audio = AudioBuffer(max_seconds=120.0)
    status = StatusLog()
    supervisor = CameraSupervisor(
        "paced",
        parse_source(str(sample_clip)),
        video=mailbox,
        audio=audio,
        on_status=status,
        backend=backend,
        policy=FAST_POLICY,
        realtime=True,
        max_frames=30,
    )
    frames, chunks = FrameLog(), list[AudioChunk]()
    started = time.monotonic()
    async with asyncio.TaskGroup() as group:
        group.create_task(drain_frames(mailbox, frames))
        group.create_task(drain_audio(audio, chunks))
        state = await supervisor.run()
    wall = time.monotonic() - started

    assert state is StreamState.STOPPED
    assert "frame limit" in (status.events[-1].reason or "")
    assert supervisor.stats.frames == 30
    assert frames.pts[-1] == pytest.approx(2.9, abs=0.05)
    # Decoding 30 frames unpaced takes a small fraction of a second; paced it spans the media time.
    assert wall >= 2.5
    assert frames.captured_at[-1] - frames.captured_at[0] >= 0.9 * (frames.pts[-1] - frames.pts[0])
    # Audio is not dumped ahead of the paced video (an ASR buffer would overflow).
    assert sum(c.duration for c in chunks) < 6.0


async def test_stop_unblocks_a_reader_waiting_on_a_full_mailbox(backend: str, sample_clip: Path) -> None:
    mailbox = FrameMailbox(blocking=True)  # nobody takes frames: the reader blocks in put()
    status = StatusLog()
    supervisor = CameraSupervisor(
        "blocked",
        parse_source(str(sample_clip)),
        video=mailbox,
        audio=None,
        on_status=status,
        backend=backend,
        policy=FAST_POLICY,
    )
    task = asyncio.create_task(supervisor.run())
    await status.wait_for(StreamState.LIVE)
    supervisor.stop()
    state = await asyncio.wait_for(task, timeout=10)
    assert state is StreamState.STOPPED
    assert status.states[-1] is StreamState.STOPPED and status.events[-1].reason == "stopped"
    assert mailbox.closed and mailbox.stats.put == 1


async def test_a_cancel_that_lands_as_the_supervisor_wakes_still_stops_it(sample_clip: Path) -> None:
    """A stream whose frame consumer failed cancels its source while the reader waits on the full
    mailbox. A cancel in the same loop turn as a wake of the watch loop was lost (asyncio.wait_for,
    Python 3.11): the supervisor went on watching a reader that never ends, and the stream hung."""
    mailbox = FrameMailbox(blocking=True)  # nobody takes frames: the reader blocks in put()
    status = StatusLog()
    supervisor = CameraSupervisor(
        "blocked", parse_source(str(sample_clip)), video=mailbox, audio=None, on_status=status, policy=STEADY_POLICY
    )
    task = asyncio.create_task(supervisor.run())
    await status.wait_for(StreamState.LIVE)
    await asyncio.sleep(0.1)  # the watch loop waits for its next look (a second away)
    supervisor._wake.set()  # what a first frame or stop() does, in the cancel's loop turn
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 20)  # a lost cancel: TimeoutError here
    assert status.states[-1] is StreamState.STOPPED and status.events[-1].reason == "cancelled"
    assert mailbox.closed


def _without_faststart_truncated(sample_clip: Path, out: Path, size: int = 200_000) -> Path:
    """Remux the clip with its index at the end (no faststart), then cut it to `size` bytes."""
    remuxed = out.with_suffix(".full.mp4")
    with av.open(str(sample_clip)) as src, av.open(str(remuxed), "w") as dst:
        streams = {s.index: dst.add_stream_from_template(s) for s in src.streams}
        for packet in src.demux():
            if packet.dts is None:
                continue
            packet.stream = streams[packet.stream.index]
            dst.mux(packet)
    return _truncated_copy(remuxed, out, size)


def _truncated_copy(source: Path, out: Path, size: int = 200_000) -> Path:
    out.write_bytes(source.read_bytes()[:size])
    return out


# Each file here fails with its decoder's own reason within a second; the open timeout is only long
# enough that a loaded machine does not turn that reason into "no video within 3 s" (seen once).
REASON_POLICY = dataclasses.replace(FAST_POLICY, open_timeout_s=15.0)


async def _run_file(path: Path, backend: str) -> tuple[StreamState, StatusLog, CameraSupervisor]:
    status = StatusLog()
    mailbox = FrameMailbox(blocking=True)
    supervisor = CameraSupervisor(
        "bad", parse_source(str(path)), video=mailbox, audio=None, on_status=status, backend=backend,
        policy=REASON_POLICY,
    )
    async with asyncio.TaskGroup() as group:
        group.create_task(drain_frames(mailbox, FrameLog()))
        state = await asyncio.wait_for(supervisor.run(), timeout=30)
    return state, status, supervisor


async def test_garbage_file_fails_with_a_reason(backend: str, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(7).integers(0, 256, 100_000, dtype=np.uint8).tobytes())
    state, status, supervisor = await _run_file(garbage, backend)
    assert state is StreamState.FAILED
    assert status.states == [StreamState.CONNECTING, StreamState.FAILED]  # files are not retried
    reason = status.events[-1].reason or ""
    assert reason.startswith("not a media file or corrupt:") and "\n" not in reason
    assert supervisor.stats.last_error == reason


async def test_truncated_mp4_without_index_fails(backend: str, sample_clip: Path, tmp_path: Path) -> None:
    cut = _without_faststart_truncated(sample_clip, tmp_path / "cut.mp4")
    state, status, _ = await _run_file(cut, backend)
    assert state is StreamState.FAILED
    reason = status.events[-1].reason or ""
    assert "not a media file or corrupt" in reason and "\n" not in reason


async def test_truncated_mp4_with_index_plays_what_is_there_then_fails(
    backend: str, sample_clip: Path, tmp_path: Path
) -> None:
    """The index (moov) is at the front, the media data is cut: what decodes is delivered,
    then the stream fails, saying how far it got."""
    cut = _truncated_copy(sample_clip, tmp_path / "cut_faststart.mp4")
    state, status, supervisor = await _run_file(cut, backend)
    assert state is StreamState.FAILED
    assert status.states == [StreamState.CONNECTING, StreamState.LIVE, StreamState.FAILED]
    assert (status.events[-1].reason or "").startswith("file ended early at ")
    assert 1 <= supervisor.stats.frames < CLIP_FRAMES


async def test_audio_only_file_has_no_video(backend: str, sample_dir: Path) -> None:
    state, status, _ = await _run_file(sample_dir / "narration.wav", backend)
    assert state is StreamState.FAILED
    assert (status.events[-1].reason or "").startswith("no video stream in ")
