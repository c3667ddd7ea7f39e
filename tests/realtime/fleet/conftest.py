"""One nats-server and one RTSP server for the fleet tests (module scope: the workers outlive a test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from realtime.bus.embedded import EmbeddedNatsServer
from tests.support.nats import running_server
from tests.support.rtsp import RtspServer, running_rtsp


@pytest.fixture(scope="module")
def fleet_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    yield from running_server(tmp_path_factory.mktemp("fleet-nats"))


@pytest.fixture(scope="module")
def live_rtsp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RtspServer]:
    """/test: an endless live 320x240 source, encoded once for every client."""
    yield from running_rtsp(tmp_path_factory.mktemp("rtsp"))


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet")


def write_small_clip(path: Path, seconds: int = 120, fps: int = 10, size: tuple[int, int] = (320, 240)) -> Path:
    """A small H.264 clip of a moving block: cheap to decode six times over on two cores."""
    import av
    import numpy as np

    width, height = size
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=fps, options={"preset": "ultrafast", "g": str(fps)})
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        for index in range(seconds * fps):
            frame = np.full((height, width, 3), 40, np.uint8)
            x = (index * 4) % (width - 40)
            frame[height * 3 // 8:height * 5 // 8, x:x + 40] = (200, 180, 60)
            for packet in video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def small_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Streams read files: each worker decodes on its own, so pausing one worker stalls nobody
    else (a shared RTSP media waits for its slowest client)."""
    return write_small_clip(tmp_path_factory.mktemp("clips") / "blocks.mp4")
