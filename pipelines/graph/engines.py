"""The engines every stream shares, in one bundle: the detector, the alert snapshot store, and each
capability's engine under its key, so a new capability adds no field and no argument here.

A stage asks for its capability's engine by key (`ctx.engines.get(CAPTIONS)`); an engine with a
`health()` method adds its named checks to readiness.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, cast, runtime_checkable

from pipelines.detect import DetectionBatcher
from pipelines.rules.snapshots import SnapshotStore

E = TypeVar("E")


@dataclass(frozen=True)  # no slots: `EngineKey[T](name)` sets __orig_class__
class EngineKey(Generic[E]):
    """Names a capability's shared engine and says its type."""

    name: str


@runtime_checkable
class Healthy(Protocol):
    def health(self) -> dict[str, bool]: ...


@dataclass(frozen=True, slots=True)
class SharedEngines:
    detector: DetectionBatcher
    snapshots: SnapshotStore | None = None  # alert pictures; None: alerts carry `snapshot: null`
    opened: Mapping[str, object] = field(default_factory=dict)  # capability name -> its engine (absent: off)

    def get(self, key: EngineKey[E]) -> E | None:
        return cast("E | None", self.opened.get(key.name))

    def health(self) -> dict[str, bool]:
        """Named checks of the shared engines (for readiness): each serves, and none of its model
        calls has run past its stuck deadline (`<name>_responsive`)."""
        checks = {"detector": self.detector.alive, "detector_responsive": not self.detector.stuck}
        for engine in self.opened.values():
            if isinstance(engine, Healthy):
                checks.update(engine.health())
        return checks
