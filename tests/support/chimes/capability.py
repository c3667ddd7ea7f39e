"""The chimes capability's declaration: everything the build needs to know about it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from pipelines.capability import Capability, OpenContext, StreamSwitch
from tests.support.chimes import stage
from tests.support.chimes.body import ChimeBody
from tests.support.chimes.config import ChimesSettings
from tests.support.chimes.rule import ChimeRule


@contextlib.asynccontextmanager
async def open_chimes(settings: ChimesSettings, _context: OpenContext) -> AsyncIterator[ChimesSettings | None]:
    yield settings if settings.enabled else None


CAPABILITY: Capability[ChimesSettings, ChimesSettings] = Capability(
    key=stage.CHIMES,
    section="chimes",
    settings=ChimesSettings,
    open=open_chimes,
    build=stage.build,
    bodies=(ChimeBody,),
    rules=(ChimeRule,),
    service="tests.support.chimes.plugin",
    switch=StreamSwitch(stage.STAGE_NAME, "the stream's chimes (when chimes.enabled)"),
)
