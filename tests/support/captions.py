"""One caption stage on real speech, as the caption tests drive it: audio fed at a chosen speed
(on a schedule) into an AudioBuffer, the events it publishes collected. `broken_multilingual_parts`
makes the multilingual model's parts fail to join, for the tests of what a bad install does."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from pipelines.captions.engine import CaptionEngine
from pipelines.captions.stage import CaptionStage
from pipelines.events import Event, EventKind
from pipelines.frames import AudioChunk
from pipelines.mailbox import AudioBuffer

CHUNK = 320  # 20 ms, as RTP audio arrives


def broken_multilingual_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The multilingual base's installed parts replaced by one that does not join, in an empty cache."""
    from engines.asr import bundled

    broken = tmp_path / "part"
    broken.mkdir()
    (broken / "model.bin.part1").write_bytes(b"not the weights")
    monkeypatch.setattr(bundled, "CACHE_ROOT", tmp_path / "cache")
    monkeypatch.setattr(bundled, "_data_dir", lambda part: broken)


class Collect:
    """The events a stage published, in order; `stage` is the stage `caption` ran."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.stage: CaptionStage | None = None

    async def publish(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: EventKind) -> list[dict[str, object]]:
        return [dict(e.data) for e in self.events if e.kind == kind]


async def caption(
    engine: CaptionEngine,
    samples: np.ndarray,
    *,
    start_pts: float = 100.0,
    speed: float = 4.0,
    sink: Collect | None = None,
    model: str | None = None,
) -> Collect:
    """Feed `samples` to a caption stage `speed` times faster than real time; wait for it to finish
    (`model`: the stream names its own)."""
    sink = sink or Collect()
    buffer = AudioBuffer(max_seconds=60.0)
    stage = sink.stage = CaptionStage("s1", buffer, engine, sink, model=model)
    task = asyncio.create_task(stage.run())
    begin, paced = time.time(), time.monotonic()
    for offset in range(0, samples.shape[0], CHUNK):
        pts = start_pts + offset / 16_000
        buffer.put(AudioChunk("s1", pts, begin + offset / 16_000, samples[offset : offset + CHUNK]))
        if offset % (CHUNK * 10) == 0:  # on a schedule: sleeps that run late do not add up
            await asyncio.sleep(max(0.0, paced + (offset + CHUNK * 10) / 16_000 / speed - time.monotonic()))
    buffer.close()
    await asyncio.wait_for(task, 60)
    return sink
