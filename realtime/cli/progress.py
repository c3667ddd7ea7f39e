"""Live progress for foreground runs: one status line per interval on stderr."""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

from realtime.streams.runner import StreamRunner


def progress_line(runner: StreamRunner) -> str:
    s = runner.summary()
    people = ""
    if runner.frame_loop is not None:
        people = f"  tracks {len(runner.frame_loop.tracker.active_tracks)} live/{s.get('tracks'):.0f} total"
    lat = f"  p50 {s.latency_p50_ms:.0f} ms" if s.latency_p50_ms is not None else ""
    return (
        f"[{s.stream_id}] {s.state:<12} {s.elapsed_s:6.1f}s  in {s.get('frames_in'):.0f}"
        f"  processed {s.get('frames_processed'):.0f}"
        f"  dropped {s.get('frames_dropped'):.0f}  {s.fps_processed:.1f} fps{people}{lat}"
    )


async def report_progress(runner: StreamRunner, *, interval: float = 1.0, out: TextIO | None = None) -> None:
    stream = out or sys.stderr
    tty = stream.isatty()
    # A terminal gets one line rewritten in place; a log file gets a line every few seconds.
    every = interval if tty else max(interval, 5.0)
    try:
        while True:
            await asyncio.sleep(every)
            line = progress_line(runner)
            stream.write(f"\r\x1b[2K{line}" if tty else f"{line}\n")
            stream.flush()
    finally:
        if tty:
            stream.write("\n")
            stream.flush()
