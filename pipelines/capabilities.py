"""The capabilities this build has, in the order their stages are built (see pipelines.capability).

Adding a capability is one package with a `capability.py`, plus one line in `BUILT_IN`. Everything
that follows from the list (the config's sections, switches and rule types, the event kinds, the
stages, the service plugins, the timeline's kinds) is read from `CAPABILITIES` when it is needed,
so `installed` can add one for a while (a test's own capability) without editing any file.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from pipelines.capability import Capability, OpenContext, Sample
from pipelines.captions.capability import CAPABILITY as CAPTIONS
from pipelines.clips.capability import CAPABILITY as CLIPS
from pipelines.describe.capability import CAPABILITY as DESCRIPTIONS
from pipelines.event_bodies import CORE_BODIES
from pipelines.events import EventBody, forget_declarations
from pipelines.rules.specs import CORE_RULES, Rule, rule_list
from pipelines.segment.capability import CAPABILITY as SEGMENTATION

BUILT_IN: tuple[Capability[Any, Any], ...] = (
    CAPTIONS,
    DESCRIPTIONS,
    SEGMENTATION,
    CLIPS,
)


class _Registry(Sequence[Capability[Any, Any]]):
    """The built-in capabilities, then those installed for now, in that order."""

    def __init__(self) -> None:
        self.extra: list[Capability[Any, Any]] = []

    def _all(self) -> tuple[Capability[Any, Any], ...]:
        return (*BUILT_IN, *self.extra)

    @overload
    def __getitem__(self, index: int) -> Capability[Any, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Capability[Any, Any]]: ...

    def __getitem__(self, index: int | slice) -> Capability[Any, Any] | Sequence[Capability[Any, Any]]:
        return self._all()[index]

    def __iter__(self) -> Iterator[Capability[Any, Any]]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(BUILT_IN) + len(self.extra)

    def __repr__(self) -> str:
        return f"CAPABILITIES({[c.name for c in self]})"


CAPABILITIES: Sequence[Capability[Any, Any]] = _Registry()


@contextlib.contextmanager
def installed(*capabilities: Capability[Any, Any]) -> Iterator[None]:
    """These capabilities are in the registry for the duration, after the built-in ones, as if
    each had its line in `BUILT_IN`. What is built from the registry once (the `Config` model of
    `realtime.config`) is built again by whoever needs it (`config_model(CAPABILITIES)`)."""
    assert isinstance(CAPABILITIES, _Registry)
    names = {c.name for c in CAPABILITIES}
    clash = [c.name for c in capabilities if c.name in names]
    if clash or len({c.name for c in capabilities}) != len(capabilities):
        raise ValueError(f"a capability is in the registry twice: {', '.join(clash) or 'among those given'}")
    CAPABILITIES.extra.extend(capabilities)
    forget_declarations()
    try:
        yield
    finally:
        for capability in capabilities:
            CAPABILITIES.extra.remove(capability)
        forget_declarations()


def declared_bodies() -> tuple[type[EventBody], ...]:
    """Every event kind's body: the core kinds', then each capability's (pipelines.events reads them)."""
    return (*CORE_BODIES, *(body for c in CAPABILITIES for body in c.bodies))


def rule_types() -> tuple[type[Rule], ...]:
    """Every rule type: the frame loop's, then each capability's."""
    return (*CORE_RULES, *(rule for c in CAPABILITIES for rule in c.rules))


def rule_owner(rule: type[Rule]) -> Capability[Any, Any] | None:
    """The capability that declares a rule type (None: a core type)."""
    return next((c for c in CAPABILITIES if rule in c.rules), None)


if TYPE_CHECKING:
    RuleList = list[Rule]
else:
    RuleList = rule_list(rule_types())  # the built-in capabilities' (the config builds its own)


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
