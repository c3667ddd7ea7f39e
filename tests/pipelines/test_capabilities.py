"""The capability registry: each capability declares its section, engine, stage and kinds once,
and the config, the stage list, the engines bundle and /metrics follow the declarations."""

from __future__ import annotations

import asyncio
import contextlib
import typing
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from pipelines.capabilities import CAPABILITIES, open_capabilities, samples, shares_cpu
from pipelines.capability import Capability, CapabilityError, OpenContext, Sample
from pipelines.events import KINDS
from pipelines.graph.engines import EngineKey, SharedEngines
from pipelines.sections import Section
from pipelines.stages import DEFAULT_STAGES
from realtime.config import Config


def test_every_capability_owns_one_config_section_of_its_own_model() -> None:
    names = [c.name for c in CAPABILITIES]
    sections = [c.section for c in CAPABILITIES]
    assert len(set(names)) == len(names) and len(set(sections)) == len(sections)
    hints = typing.get_type_hints(Config)
    for capability in CAPABILITIES:
        assert hints[capability.section] is capability.settings, capability.name
        assert isinstance(getattr(Config(), capability.section), capability.settings)


def test_each_event_kind_has_at_most_one_capability_and_every_stage_is_in_the_graph() -> None:
    owned = [kind for c in CAPABILITIES for kind in c.kinds]
    assert len(owned) == len(set(owned)) and set(owned) <= set(KINDS)
    for capability in CAPABILITIES:
        assert capability.build in DEFAULT_STAGES, capability.name


def test_the_models_on_the_cpu_are_those_the_sections_put_there() -> None:
    config = Config.model_validate({"segmentation": {"enabled": True, "yolo_seg": "m.onnx"}})
    section = lambda key: getattr(config, key)  # noqa: E731
    assert shares_cpu(section) == ["captions", "segmentation"]
    assert shares_cpu(section, off=["captions"]) == ["segmentation"]
    cuda = Config.model_validate({"captions": {"device": "cuda"}})
    assert shares_cpu(lambda key: getattr(cuda, key)) == []


@dataclass
class Toy:
    closed: bool = False

    def health(self) -> dict[str, bool]:
        return {"toy": not self.closed}


class ToySection(Section):
    enabled: bool = True
    fail: bool = False


TOY: EngineKey[Toy] = EngineKey("toy")
opened_toys: list[Toy] = []


@contextlib.asynccontextmanager
async def open_toy(settings: ToySection, _context: OpenContext) -> AsyncIterator[Toy | None]:
    if settings.fail:
        raise CapabilityError("toy: cannot open (or turn it off: toy.enabled: false)")
    if not settings.enabled:
        yield None
        return
    toy = Toy()
    opened_toys.append(toy)
    try:
        yield toy
    finally:
        toy.closed = True


def toy(name: str) -> Capability[Toy, ToySection]:
    return Capability(key=EngineKey(name), section=name, settings=ToySection, open=open_toy, build=lambda ctx: None,
                      samples=lambda engine: [Sample("toy_open", "1 while open", int(not engine.closed), "gauge")])


def test_engines_open_in_order_close_in_reverse_and_one_that_fails_closes_the_others() -> None:
    sections = {"a": ToySection(), "b": ToySection(enabled=False), "c": ToySection(), "bad": ToySection(fail=True)}

    async def scenario() -> None:
        opened_toys.clear()
        caps = [toy("a"), toy("b"), toy("c")]
        async with open_capabilities(sections.__getitem__, OpenContext(), capabilities=caps, off=["c"]) as opened:
            assert list(opened) == ["a"]  # b is off by its section, c by the command
            engines = SharedEngines(detector=typing.cast(typing.Any, Health()), opened=opened)
            assert engines.get(EngineKey[Toy]("a")) is opened["a"] and engines.get(TOY) is None
            assert engines.health() == {"detector": True, "detector_responsive": True, "toy": True}
        assert opened_toys[0].closed
        opened_toys.clear()
        with pytest.raises(CapabilityError, match="toy.enabled: false"):
            async with open_capabilities(sections.__getitem__, OpenContext(), capabilities=[toy("a"), toy("bad")]):
                pass
        assert len(opened_toys) == 1 and opened_toys[0].closed

    asyncio.run(scenario())


class Health:
    alive = True
    stuck = False


def test_metrics_come_from_the_open_engines_only() -> None:
    assert list(samples({})) == []
    figures = list(samples({"a": Toy()}, [toy("a"), toy("b")]))
    assert figures == [Sample("toy_open", "1 while open", 1, "gauge")]
