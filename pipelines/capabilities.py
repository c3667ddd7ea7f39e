"""The capabilities this build has, in the order their stages are built (see pipelines.capability).

Adding a capability is one package with a `capability.py`, plus one line here.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping
from typing import Any

from pipelines.capability import Capability, OpenContext, Sample
from pipelines.captions.capability import CAPABILITY as CAPTIONS
from pipelines.clips.capability import CAPABILITY as CLIPS
from pipelines.describe.capability import CAPABILITY as DESCRIPTIONS
from pipelines.segment.capability import CAPABILITY as SEGMENTATION

CAPABILITIES: tuple[Capability[Any, Any], ...] = (
    CAPTIONS,
    DESCRIPTIONS,
    SEGMENTATION,
    CLIPS,
)


def hearing() -> list[str]:
    """The capabilities that need the streams' audio (off when a command decodes none)."""
    return [c.name for c in CAPABILITIES if c.hears]


def critical_share(section: Callable[[str], Any], *, off: Collection[str] = ()) -> float | None:
    """The most of the cores a latency-critical model takes first, as its section says (None: none says)."""
    shares = (c.critical_share(section(c.section)) for c in CAPABILITIES if c.name not in off)
    return next((share for share in shares if share is not None), None)


def shares_cpu(section: Callable[[str], Any], *, off: Collection[str] = ()) -> list[str]:
    """The capabilities whose models, as configured, run on the CPU beside the detector."""
    return [c.name for c in CAPABILITIES if c.name not in off and c.shares_cpu(section(c.section))]


@contextlib.asynccontextmanager
async def open_capabilities(
    section: Callable[[str], Any],
    context: OpenContext,
    *,
    off: Collection[str] = (),
    capabilities: Iterable[Capability[Any, Any]] = CAPABILITIES,
) -> AsyncIterator[dict[str, object]]:
    """Every capability's shared engine, open for the duration, by capability name: those turned
    off (by their section, or named in `off` by the command) are absent. Opened in order and
    closed in reverse; one that cannot open closes those opened before it."""
    opened: dict[str, object] = {}
    async with contextlib.AsyncExitStack() as stack:
        for capability in capabilities:
            if capability.name in off:
                continue
            engine = await stack.enter_async_context(capability.open(section(capability.section), context))
            if engine is not None:
                opened[capability.name] = engine
        yield opened


def samples(
    opened: Mapping[str, object], capabilities: Iterable[Capability[Any, Any]] = CAPABILITIES
) -> Iterable[Sample]:
    """The open engines' figures for /metrics."""
    for capability in capabilities:
        engine = opened.get(capability.name)
        if engine is not None:
            yield from capability.samples(engine)
