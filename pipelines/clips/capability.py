"""Event clips as a capability: the clip store on disk, the `clips:` section, and the stage that
keeps each stream's packets and cuts the video around its alerts (off by default)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from pipelines.capability import NO_BUDGET, Capability, CapabilityError, OpenContext, StreamSwitch
from pipelines.clips import stage
from pipelines.clips.config import ClipsSettings
from pipelines.clips.engine import CLIPS, ClipEngine, store_samples
from pipelines.clips.store import ClipStore, StreamBounds

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def open_clips(settings: ClipsSettings, _context: OpenContext = NO_BUDGET) -> AsyncIterator[ClipEngine | None]:
    """The clip store every stream writes to, for the duration; None when clips are off."""
    if not settings.enabled:
        yield None
        return
    bounds = {stream_id: StreamBounds(own.max_bytes, own.max_age_s) for stream_id, own in settings.streams.items()
              if own.max_bytes is not None or own.max_age_s is not None}
    store = ClipStore(settings.dir, settings.max_total_bytes, settings.max_age_s, bounds)
    try:
        await asyncio.to_thread(store.open)
    except OSError as exc:
        raise CapabilityError(f"clips.dir {settings.dir}: {exc.strerror or exc} (or turn clips off: "
                              "clips.enabled: false)") from exc
    log.info("event clips on", extra={"dir": str(settings.dir), "clips": len(store)})
    yield ClipEngine(store, settings)


CAPABILITY: Capability[ClipEngine, ClipsSettings] = Capability(
    key=CLIPS,
    section="clips",
    settings=ClipsSettings,
    open=open_clips,
    build=stage.build,
    bodies=(stage.ClipBody,),
    service="realtime.service.plugins.clips",
    samples=store_samples,
    switch=StreamSwitch(stage.STAGE_NAME, "the video around its alerts (when clips.enabled)"),
)
