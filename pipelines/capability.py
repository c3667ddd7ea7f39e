"""What a capability declares about itself, so that nothing outside its package names it.

A capability (captions, descriptions, segmentation, ...) is one package under `pipelines/` with a
`capability.py` that builds one `Capability`: the config section it owns and its model (the
config schema takes every section from the registry), the engine every stream shares (opened
once for the process, with its health and its metrics), the stage each stream gets and the
per-stream switch that turns it off, the bodies of the event kinds it publishes (each declares
its kind, and what the timeline keeps of it), the rule types it answers (each a model with its
own `type`, which the config's rule union takes in), its service plugin (named by module, since
`pipelines` cannot import the service), what `vidsentry run` prints of its events, its flags of
`run` and `serve`, and whether its model shares the detector's CPU (then the compute budget is on)
and how much of it its model may take first.
`pipelines.capabilities` lists them; the config, `serve`, `run`, the service, the engines bundle,
the event kinds, the timeline and `/metrics` iterate that list.

An opener raises `CapabilityError` for what the user must fix (a missing model, a bad endpoint);
the command turns it into its usage error, with the message as written here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from pipelines.compute import ComputeBudget
from pipelines.errors import PipelineError
from pipelines.events import Event, EventBody, EventKind
from pipelines.graph.engines import EngineKey
from pipelines.graph.stage import StageFactory
from pipelines.rules.specs import Rule
from pipelines.sections import Section

E = TypeVar("E")
S = TypeVar("S", bound=Section)


class CapabilityError(PipelineError):
    """A capability cannot open as configured; the message says which setting and what to do."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One value for `/metrics`, without tying a capability to a metrics library. Samples of one
    name form one family (a counter is exposed with the `_total` suffix)."""

    name: str
    help: str
    value: float
    kind: Literal["counter", "gauge"] = "counter"
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class OpenContext:
    """What an opener may use besides its own section."""

    compute: ComputeBudget | None = None  # the CPU budget a model on the CPU adds its claim to


NO_BUDGET = OpenContext()  # every model uses the cores as it likes


@dataclass(frozen=True, slots=True)
class StreamSwitch:
    """A per-stream setting (true by default) that turns the capability's stage off for one stream.

    With `settings`, the same key may also hold a mapping of that model instead of true: the
    stage is on, and each key given wins over the capability's section for this stream
    (`captions: {language: es}`). The graph hands the model to the stage by the stage's name
    (`ctx.spec.own(name)`); the capability checks it against its open engine (`stream_problems`)."""

    name: str  # the stream setting's key: the stage's name, which the graph reads
    help: str  # what it turns off, for the config schema and the docs
    settings: type[Section] | None = None  # the stream's own settings of the capability; None: a switch only


class Printer(Protocol):
    """What `vidsentry run` prints of a capability's events on stdout, and counts for its summary."""

    def see(self, event: Event) -> list[str]: ...  # the lines this event completes (every event is shown)

    def flush(self) -> list[str]: ...  # what is still held, at the end of the run

    def counts(self) -> dict[str, int]: ...  # for the run's summary, by key


@dataclass(frozen=True, slots=True)
class Flag:
    """A flag of `run` and `serve` that wins over one key of the capability's section, checked as
    the section checks it (`--vlm-url URL` is `vlm.endpoints: [URL]`)."""

    name: str  # "--vlm-url"
    help: str
    key: str  # the section's key it sets
    value: Callable[[str], Any] = str  # the key's value made of the flag's

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


def _never(_settings: Any) -> bool:
    return False


def _no_share(_settings: Any) -> float | None:
    return None


def _no_samples(_engine: Any) -> Iterable[Sample]:
    return ()


def _no_problems(_engine: Any, _own: Sequence[Any]) -> list[tuple[int, str]]:
    return []


def _section_enabled(settings: Any) -> bool:
    return bool(getattr(settings, "enabled", True))


@dataclass(frozen=True, slots=True)
class Capability(Generic[E, S]):
    key: EngineKey[E]  # its engine in `SharedEngines`; its name names the capability
    section: str  # its key in the config file
    settings: type[S]  # that section's model
    open: Callable[[S, OpenContext], AbstractAsyncContextManager[E | None]]  # None: off as configured
    build: StageFactory  # each stream's stage (None where the stream or the service has it off)
    bodies: tuple[type[EventBody], ...] = ()  # the bodies of the event kinds its stage publishes (each declares one)
    rules: tuple[type[Rule], ...] = ()  # the rule types its stage answers (`streams[].rules[].type`)
    # Its service plugin: the module (under `realtime`, which `pipelines` cannot import) whose
    # `PLUGIN` is its `ServicePlugin`; None: it has no service parts.
    service: str | None = None
    configured_on: Callable[[S], bool] = _section_enabled  # on as its section says (its rules can be answered)
    printer: Callable[[S], Printer] | None = None  # what `run` prints of its events; None: nothing
    flags: tuple[Flag, ...] = ()  # its flags of `run` and `serve`
    shares_cpu: Callable[[S], bool] = _never  # as configured, its model runs on the CPU beside the detector
    # Its model is latency-critical: the most of the cores' recent time it takes first under the
    # compute budget, as configured (None: the compute section's bound).
    critical_share: Callable[[S], float | None] = _no_share
    switch: StreamSwitch | None = None  # its per-stream switch; None: on wherever the service has it on
    hears: bool = False  # its stage reads the stream's audio: where none is decoded it is not opened
    samples: Callable[[E], Iterable[Sample]] = _no_samples  # its engine's figures for /metrics
    # Streams' own settings (its switch's `settings`, None where a stream gives none) checked together
    # against its open engine (None: off): (index, reason) for each that it cannot serve. The config's
    # streams are checked at once (together they may ask more than it holds), the API's one by one.
    stream_problems: Callable[[E | None, Sequence[Any]], list[tuple[int, str]]] = _no_problems

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def kinds(self) -> tuple[EventKind, ...]:
        """The event kinds its stage publishes, as its bodies declare them."""
        return tuple(body.spec.kind for body in self.bodies)
