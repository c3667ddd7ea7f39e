"""What the outside world sees of one stream: its settings, state and counters.

The registry builds these for the HTTP API and the metrics collector. Reading counters
must stay cheap (a scrape reads every stream), so nothing here sorts latency windows the
way `StreamRunner.summary()` does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from realtime.config import StreamSettings
from realtime.sources.spec import InvalidSource, parse_source
from realtime.stream_runner import StreamRunner

PENDING = "pending"  # desired, not started yet (or waiting for its previous run to stop)


@dataclass(frozen=True, slots=True)
class StreamCounters:
    frames_in: int = 0
    frames_processed: int = 0
    frames_dropped: int = 0  # replaced in the mailbox before the detector took them
    frames_skipped: int = 0  # left out by the detect_fps cap
    frames_failed: int = 0
    detections: int = 0
    tracks: int = 0
    track_events: int = 0
    reconnects: int = 0
    stalls: int = 0
    corrupt_packets: int = 0
    audio_seconds: float = 0.0
    status_events_dropped: int = 0
    # Queue depths right now.
    mailbox_depth: int = 0
    audio_buffered_s: float = 0.0
    status_queue_depth: int = 0


def read_counters(runner: StreamRunner) -> StreamCounters:
    loop = runner.frame_loop.stats if runner.frame_loop else None
    source = runner.supervisor.stats if runner.supervisor else None
    audio = runner.audio
    status_queue = runner.status_queue_depth
    return StreamCounters(
        frames_in=source.frames if source else 0,
        frames_processed=loop.frames_processed if loop else 0,
        frames_dropped=runner.mailbox.stats.dropped if runner.mailbox else 0,
        frames_skipped=loop.frames_skipped if loop else 0,
        frames_failed=loop.frames_failed if loop else 0,
        detections=loop.detections if loop else 0,
        tracks=loop.tracks_started if loop else 0,
        track_events=loop.track_events if loop else 0,
        reconnects=source.reconnects if source else 0,
        stalls=source.stalls if source else 0,
        corrupt_packets=source.corrupt_packets if source else 0,
        audio_seconds=round(audio.stats.seconds_in, 2) if audio else 0.0,
        status_events_dropped=runner.status_dropped,
        mailbox_depth=runner.mailbox.pending() if runner.mailbox else 0,
        audio_buffered_s=round(audio.buffered_seconds, 3) if audio else 0.0,
        status_queue_depth=status_queue,
    )


def public_url(url: str) -> str:
    """The URL as it may be shown: a network URL's password becomes ***; paths stay as given."""
    try:
        source = parse_source(url)
    except InvalidSource:
        return url if "://" not in url else "(unparseable URL)"
    return url if source.is_file else source.display


@dataclass(frozen=True, slots=True)
class StreamView:
    settings: StreamSettings
    shown_url: str
    state: str  # pending, or a StreamState value
    reason: str | None
    restarts: int  # runs started after the first one (after a failure)
    restart_in: float | None  # seconds until the next start after a failure
    counters: StreamCounters

    @property
    def stream_id(self) -> str:
        return self.settings.id

    def to_json(self) -> dict[str, Any]:
        body = self.settings.model_dump(mode="json")
        body["url"] = self.shown_url
        body.update(
            state=self.state,
            reason=self.reason,
            restarts=self.restarts,
            restart_in=None if self.restart_in is None else round(self.restart_in, 1),
            counters=asdict(self.counters),
        )
        return body
