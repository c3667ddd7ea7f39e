"""What every stream's clips stage shares: the clip store and the settings."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pipelines.capability import Sample
from pipelines.clips.config import ClipsSettings
from pipelines.clips.store import ClipStore
from pipelines.graph.engines import EngineKey


@dataclass(frozen=True, slots=True)
class ClipEngine:
    store: ClipStore
    settings: ClipsSettings


CLIPS: EngineKey[ClipEngine] = EngineKey("clips")  # the engine in SharedEngines


def store_samples(engine: ClipEngine) -> Iterable[Sample]:
    store = engine.store
    stats = store.stats
    yield Sample("vidsentry_clips_stored", "Clips on disk", len(store), "gauge")
    yield Sample("vidsentry_clips_stored_bytes", "Bytes of clips on disk", store.total_bytes, "gauge")
    yield Sample("vidsentry_clips_written", "Clips written", stats.written)
    yield Sample("vidsentry_clips_write_failures", "Clips the disk refused", stats.failed)
    for why, value in (("bytes", stats.evicted_bytes), ("age", stats.evicted_age),
                       ("stream_bytes", stats.evicted_stream_bytes), ("stream_age", stats.evicted_stream_age)):
        yield Sample("vidsentry_clips_evicted", "Clips deleted by retention", value, labels=(("reason", why),))
    yield Sample("vidsentry_clips_redacted_on_export", "Clips re-encoded with boxes pixelated on first download",
                 stats.redacted_on_export)
