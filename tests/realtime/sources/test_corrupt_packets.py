"""Issue 23, Medium 4: a packet that does not decode is a corrupt packet, whatever the decoder says
and on whichever track; only a container that cannot be read ends a file.

The damaged copies flip bits inside the packets' payloads only (the mp4 tables are intact), as
a bad disk or a lossy transfer would."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import av
import av.error
import numpy as np
import pytest

from pipelines.frames import StreamState
from realtime.sources import parse_source
from realtime.sources.pyav_source import MAX_CONSECUTIVE_CORRUPT, PyAVSession
from realtime.sources.session import SessionOptions
from tests.realtime.sources.util import FrameLog, StatusLog, play_file

CLIP_FRAMES = 795


def flip_payload_bits(source: Path, out: Path, rate: float, seed: int, tracks: tuple[str, ...]) -> dict[str, int]:
    """A copy of `source` with each bit of the named tracks' packet payloads flipped with
    probability `rate`; the container's own structures are left alone."""
    data = np.frombuffer(source.read_bytes(), dtype=np.uint8).copy()
    rng = np.random.default_rng(seed)
    flipped = dict.fromkeys(tracks, 0)
    with av.open(str(source)) as container:
        for packet in container.demux():
            kind = packet.stream.type
            if kind not in tracks or packet.pos is None or packet.pos < 0 or not packet.size:
                continue
            bits = rng.random((packet.size, 8)) < rate
            data[packet.pos : packet.pos + packet.size] ^= np.packbits(bits, axis=1).reshape(-1)
            flipped[kind] += int(bits.sum())
    out.write_bytes(data.tobytes())
    return flipped


@pytest.fixture(scope="module")
def damaged_clip(sample_clip: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """0.1 % of the audio's bits and 0.001 % of the video's flipped: the AAC decoder answers
    some packets with EPERM ("Operation not permitted"), others with invalid data."""
    work = tmp_path_factory.mktemp("damaged")
    audio = work / "audio.mp4"
    flip_payload_bits(sample_clip, audio, 1e-3, seed=1, tracks=("audio",))
    out = work / "damaged.mp4"
    flip_payload_bits(audio, out, 1e-5, seed=2, tracks=("video",))
    return out


def test_the_damaged_clip_has_what_the_issue_saw(damaged_clip: Path) -> None:
    """Guards the fixture: PyAV itself raises PermissionError on some of its audio packets."""
    errors: set[type] = set()
    with av.open(str(damaged_clip)) as container:
        for packet in container.demux(container.streams.audio[0]):
            try:
                packet.decode()
            except av.error.FFmpegError as exc:
                errors.add(type(exc))
    assert av.error.PermissionError in errors


async def _run(path: Path, backend: str, *, audio: bool = True) -> tuple[StreamState, StatusLog, Any, FrameLog, float]:
    play = await play_file(path, backend, stream_id="damaged", audio=audio)
    return play.state, play.status, play.supervisor, play.frames, sum(c.duration for c in play.chunks)


async def test_a_damaged_file_plays_to_its_end(backend: str, damaged_clip: Path) -> None:
    """Both tracks damaged: the file plays to its end with its audio; what did not decode is
    counted, not fatal (today: PyAV fails at the first EPERM from the AAC decoder)."""
    state, status, supervisor, frames, audio_s = await _run(damaged_clip, backend)
    assert state is StreamState.STOPPED, status.events[-1].reason
    assert status.events[-1].reason == "end of file"
    assert len(frames.seqs) >= 0.9 * CLIP_FRAMES and frames.pts[-1] > 78.0
    assert audio_s > 10.0  # of the 50 s narration: what the AAC decoder still makes something of
    if backend == "pyav":
        assert supervisor.stats.corrupt_packets >= 10


async def test_an_undecodable_audio_track_is_dropped_and_the_video_goes_on(
    sample_clip: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every audio packet garbage (half its bits flipped): after MAX_CONSECUTIVE_CORRUPT failures in a
    row PyAV stops decoding the audio, and every video frame still arrives."""
    garbage = tmp_path / "garbage_audio.mp4"
    flip_payload_bits(sample_clip, garbage, 0.5, seed=3, tracks=("audio",))
    state, status, supervisor, frames, _ = await _run(garbage, "pyav")
    assert state is StreamState.STOPPED, status.events[-1].reason
    assert frames.seqs == list(range(CLIP_FRAMES))
    assert supervisor.stats.corrupt_packets >= MAX_CONSECUTIVE_CORRUPT
    assert any("audio track undecodable" in r.getMessage() for r in caplog.records)


class _Packet:
    is_corrupt = False

    def __init__(self, error: Exception) -> None:
        self.error = error

    def decode(self) -> list[Any]:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        av.error.PermissionError(errno.EPERM, "Operation not permitted"),
        av.error.InvalidDataError(errno.EINVAL, "Invalid data found when processing input"),
        av.error.ArgumentError(errno.EINVAL, "Invalid argument"),
        av.error.OSError(errno.EIO, "Input/output error"),
        av.error.PatchWelcomeError(0, "Not yet implemented in FFmpeg, patches welcome"),
    ],
)
def test_any_decoder_error_is_one_corrupt_packet(sample_clip: Path, error: Exception) -> None:
    session = PyAVSession(parse_source(str(sample_clip)), SessionOptions())
    for track in ("video", "audio"):
        assert session._decode(_Packet(error), track) == []
    assert session.corrupt_packets == 2
