"""The `timeline:` config section: the search index of everything the streams reported."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from pipelines.sections import Section


class TimelineSettings(Section):
    """Captions, descriptions, alerts, track summaries and clips, searchable (GET /api/search)."""

    enabled: bool = True
    # One SQLite file. None: a temporary one for this run, filled from JetStream at start (the
    # embedded NATS keeps its events for the run only, so that is all there is to index).
    path: Path | None = None
    max_entries: int = Field(5_000_000, ge=1000, le=1_000_000_000)  # the oldest go first
    max_age_s: float = Field(30 * 86400.0, gt=0, le=10 * 366 * 86400.0)  # older entries are deleted
    batch: int = Field(256, ge=1, le=10_000)  # events read and committed at once
