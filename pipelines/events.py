"""Events as the pipelines produce them, before the bus wraps them in CloudEvents.

Between stages an event's body is typed (one dataclass per kind, `pipelines.event_bodies` for the
core kinds, a capability's package for its own): a stage reads `event.body` narrowed with
`isinstance`, never a dict whose keys it must remember. The JSON object is made once, at the bus
edge (`realtime.bus.cloudevents.encode`), from `Event.data`; field names and their order there are
the wire contract (docs/events.md).

The list of kinds is open: a body class declares its kind (`spec = KindSpec(...)`), and `KINDS` is
the core bodies' declarations plus those of each capability in the registry
(`pipelines.capabilities`), so a capability's new kind edits nothing here. `EventKind` is a string
that only a declared kind can be: `EventKind("captions")` and `EventKind.CAPTIONS` name the same
object, whichever package declared it, and iterating `EventKind` gives every declared kind.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol, TypeVar

_T = TypeVar("_T")


class _DeclaredKinds(type):
    """`EventKind`'s class: its attributes, calls and iteration read the declared kinds."""

    def __getattr__(cls, name: str) -> EventKind:
        if not name.isupper():
            raise AttributeError(name)
        try:
            return _table().names[name]
        except KeyError:
            raise AttributeError(f"no event kind {name.lower()!r} is declared") from None

    def __iter__(cls) -> Iterator[EventKind]:
        return iter([spec.kind for spec in _table().specs.values()])

    def __len__(cls) -> int:
        return len(_table().specs)

    def __call__(cls, value: object) -> EventKind:
        """The declared kind named `value`; ValueError when no body declares it."""
        found = _table().specs.get(value) if isinstance(value, str) else None
        if found is None:
            raise ValueError(f"{value!r} is not a declared event kind")
        return found.kind


class EventKind(str, metaclass=_DeclaredKinds):
    """An event kind's name, as it goes on the wire (`vidsentry.<stream>.<kind>`). Made only by a
    `KindSpec`; one object per name, so `is` compares kinds."""

    __slots__ = ()

    @property
    def value(self) -> str:
        return str.__str__(self)

    @property
    def name(self) -> str:
        return self.value.upper()

    def __repr__(self) -> str:
        return f"<EventKind.{self.name}: {self.value!r}>"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _named, (self.value,)  # a copy or an unpickled kind is the same object


_NAMES: dict[str, EventKind] = {}  # every kind ever named by a KindSpec, declared or not (one object per name)


def _named(value: str) -> EventKind:
    kind = _NAMES.get(value)
    if kind is None:
        kind = _NAMES[value] = str.__new__(EventKind, value)
    return kind


class Delivery(StrEnum):
    """What a reader that falls behind (a browser's DataChannel, an SSE client) may skip."""

    LATEST = "latest"  # a newer event makes a waiting one worthless: only the newest waits
    EVERY = "every"  # each one counts, but it may be dropped (counted) when the reader is far behind
    CRITICAL = "critical"  # never dropped while the reader reads


@dataclass(frozen=True, slots=True, init=False)
class KindSpec:
    """One declaration per event kind, made by its body class: the bus, the DataChannel and the run
    summary read these."""

    kind: EventKind
    durable: bool  # must survive a subscriber or broker outage: JetStream, acked, kept in the outbox
    delivery: Delivery

    def __init__(self, kind: str, *, durable: bool, delivery: Delivery) -> None:
        object.__setattr__(self, "kind", _named(kind))
        object.__setattr__(self, "durable", durable)
        object.__setattr__(self, "delivery", delivery)


@dataclass(frozen=True, slots=True)
class Findable:
    """What the timeline keeps of one event to find it again (a body's `search`): its words, its
    media time span and, per kind, a little more for a hit to point at."""

    text: str
    start: float | None
    end: float | None
    extra: Mapping[str, Any] = field(default_factory=dict)
    replaces: tuple[str, ...] = ()  # the event ids whose entries this one replaces


class EventBody:
    """One kind's body. Subclasses are frozen dataclasses whose fields are what stages read;
    `fields()` is the JSON object on the wire, in the contract's order. A body that is a kind
    declares it in `spec`; its `kind` follows."""

    __slots__ = ()
    spec: ClassVar[KindSpec]
    kind: ClassVar[EventKind]
    found_as: ClassVar[str | None] = None  # a search finds it as this kind (a transcript as captions); None: its own

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = vars(cls).get("spec")
        if isinstance(spec, KindSpec):
            cls.kind = spec.kind

    def fields(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def search(cls, data: Mapping[str, Any], *, stream_id: str, pts: float | None) -> Findable | None:
        """What the timeline keeps of one event of this kind, read from its wire body `data` (as
        stored, so no typed body is rebuilt); None when this one is not kept (a track update). A
        kind whose body does not override this is not searched at all."""
        return None

    @classmethod
    def searched(cls) -> bool:
        return cls.search.__func__ is not EventBody.search.__func__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class _Table:
    specs: dict[str, KindSpec]  # by the kind's value, in declaration order
    names: dict[str, EventKind]  # by attribute name (CAPTIONS)
    bodies: dict[str, type[EventBody]]


_TABLE: _Table | None = None


def _table() -> _Table:
    global _TABLE
    if _TABLE is None:
        # The registry imports every capability's package, and it imports this module: so here,
        # when a kind is first read, not at the top.
        from pipelines.capabilities import declared_bodies

        specs: dict[str, KindSpec] = {}
        bodies: dict[str, type[EventBody]] = {}
        for body in declared_bodies():
            spec = body.spec
            if spec.kind in specs:
                raise ValueError(f"event kind {spec.kind.value!r} is declared twice ({bodies[spec.kind].__name__}, "
                                 f"{body.__name__})")
            specs[spec.kind] = spec
            bodies[spec.kind] = body
        _TABLE = _Table(specs, {spec.kind.name: spec.kind for spec in specs.values()}, bodies)
    return _TABLE


def forget_declarations() -> None:
    """The registry changed (a capability installed or removed): the kinds are read again."""
    global _TABLE
    _TABLE = None


def body_of(kind: str) -> type[EventBody]:
    """The body class that declares `kind` (KeyError: none does)."""
    return _table().bodies[kind]


class _Kinds(Mapping[EventKind, KindSpec]):
    """Every declared kind's spec, read from the registry when first needed."""

    def __getitem__(self, kind: EventKind) -> KindSpec:
        return _table().specs[kind]

    def __iter__(self) -> Iterator[EventKind]:
        return (spec.kind for spec in _table().specs.values())

    def __len__(self) -> int:
        return len(_table().specs)

    def __repr__(self) -> str:
        return f"KINDS({list(self)!r})"


KINDS: Mapping[EventKind, KindSpec] = _Kinds()


class _KindsWhere(Set[EventKind]):
    """The declared kinds with these properties, as the declarations stand when asked."""

    def __init__(self, durable: bool | None, delivery: Delivery | None) -> None:
        self._durable = durable
        self._delivery = delivery

    def _matches(self, spec: KindSpec) -> bool:
        return (self._durable is None or spec.durable == self._durable) and (
            self._delivery is None or spec.delivery is self._delivery)

    def __contains__(self, kind: object) -> bool:
        spec = _table().specs.get(kind) if isinstance(kind, str) else None
        return spec is not None and self._matches(spec)

    def __iter__(self) -> Iterator[EventKind]:
        return (spec.kind for spec in _table().specs.values() if self._matches(spec))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @classmethod
    def _from_iterable(cls, it: Iterable[_T]) -> frozenset[_T]:
        return frozenset(it)  # what `&`, `|` and `-` make: a plain set, as it stands now

    def __repr__(self) -> str:
        return f"{{{', '.join(repr(k) for k in self)}}}"


def kinds_where(*, durable: bool | None = None, delivery: Delivery | None = None) -> Set[EventKind]:
    """The declared kinds with these properties: a live set, so a kind a capability declares
    later is in it."""
    return _KindsWhere(durable, delivery)


DURABLE_KINDS: Set[EventKind] = kinds_where(durable=True)


# In a fleet, events carry the revision at which their worker took the stream's lease; larger is newer.
LEASE_FIELD = "lease_revision"


def new_event_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Event:
    stream_id: str
    pts: float | None  # media seconds; None for events not tied to media (e.g. status)
    captured_at: float  # wall-clock epoch seconds the underlying media reached the service
    body: EventBody
    id: str = field(default_factory=new_event_id)
    lease: int | None = None  # a fleet stream's fencing token (realtime.fleet), set as it goes out

    @property
    def kind(self) -> EventKind:
        return self.body.kind

    @property
    def durable(self) -> bool:
        return self.kind in DURABLE_KINDS

    @property
    def data(self) -> dict[str, Any]:
        """The body as the JSON object on the wire (made on each call: the bus edge reads it once)."""
        fields = self.body.fields()
        if self.lease is not None:
            fields[LEASE_FIELD] = self.lease
        return fields


class EventSink(Protocol):
    """Where pipelines hand events; `realtime` provides the NATS implementation.

    `publish` must not block the event loop for long: implementations queue and return.
    """

    async def publish(self, event: Event) -> None: ...

