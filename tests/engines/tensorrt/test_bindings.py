"""Binding layout read through TensorRT 10's name-based I/O API, from a stand-in engine.

The stand-in exposes exactly the attribute names the layout code calls on a real ICudaEngine /
IExecutionContext; a real engine is exercised by the GPU tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from engines.errors import EngineError
from engines.tensorrt.bindings import binding_layout

TRT = SimpleNamespace(
    TensorIOMode=SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT"),
    nptype=lambda dtype: {"FLOAT": np.float32, "HALF": np.float16, "INT32": np.int32}[dtype],
)


@dataclass
class StandInEngine:
    tensors: list[tuple[str, str, tuple[int, ...], str]]  # name, mode, shape (-1 dynamic), dtype
    profile_max: tuple[int, ...] = ()

    @property
    def num_io_tensors(self) -> int:
        return len(self.tensors)

    def get_tensor_name(self, index: int) -> str:
        return self.tensors[index][0]

    def _row(self, name: str) -> tuple[str, str, tuple[int, ...], str]:
        return next(t for t in self.tensors if t[0] == name)

    def get_tensor_mode(self, name: str) -> str:
        return self._row(name)[1]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._row(name)[2]

    def get_tensor_dtype(self, name: str) -> str:
        return self._row(name)[3]

    def get_tensor_profile_shape(self, name: str, profile: int) -> tuple[tuple[int, ...], ...]:
        assert profile == 0
        return ((1, *self.profile_max[1:]), self.profile_max, self.profile_max)


@dataclass
class StandInContext:
    engine: StandInEngine
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shapes[name] = tuple(shape)
        return shape[0] <= self.engine.profile_max[0]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        batch = self.shapes["images"][0]
        return tuple(batch if d < 0 else d for d in self.engine.get_tensor_shape(name))


def test_static_engine() -> None:
    engine = StandInEngine(
        [("images", "INPUT", (1, 3, 640, 640), "FLOAT"), ("output0", "OUTPUT", (1, 6, 8400), "FLOAT")]
    )
    layout = binding_layout(engine, TRT)
    assert layout.input.name == "images" and layout.input.is_input
    assert layout.output.shape == (1, 6, 8400) and not layout.output.is_input
    assert layout.input.nbytes == 3 * 640 * 640 * 4
    assert layout.output.nbytes == 6 * 8400 * 4
    assert layout.max_batch == 1


def test_dynamic_engine_is_sized_for_the_profile_max() -> None:
    engine = StandInEngine(
        [("images", "INPUT", (-1, 3, 320, 320), "HALF"), ("output0", "OUTPUT", (-1, 22, 2100), "HALF")],
        profile_max=(8, 3, 320, 320),
    )
    context = StandInContext(engine)
    layout = binding_layout(engine, TRT, context)
    assert context.shapes == {"images": (8, 3, 320, 320)}
    assert layout.input.shape == (8, 3, 320, 320) and layout.input.dtype == np.float16
    assert layout.output.shape == (8, 22, 2100)
    assert layout.output.nbytes == 8 * 22 * 2100 * 2
    assert layout.max_batch == 8
    with pytest.raises(EngineError, match="execution context"):
        binding_layout(engine, TRT)


def test_the_named_output_is_chosen() -> None:
    engine = StandInEngine([
        ("images", "INPUT", (1, 3, 64, 64), "FLOAT"),
        ("proto", "OUTPUT", (1, 32, 16, 16), "FLOAT"),
        ("output0", "OUTPUT", (1, 38, 84), "FLOAT"),
    ])
    assert binding_layout(engine, TRT, output_name="output0").output.name == "output0"
    assert binding_layout(engine, TRT, output_name="missing").output.name == "proto"  # first output
    assert [b.name for b in binding_layout(engine, TRT).bindings] == ["images", "proto", "output0"]


def test_two_image_inputs_are_refused() -> None:
    engine = StandInEngine([
        ("a", "INPUT", (1, 3, 64, 64), "FLOAT"),
        ("b", "INPUT", (1, 3, 64, 64), "FLOAT"),
        ("out", "OUTPUT", (1, 6, 84), "FLOAT"),
    ])
    with pytest.raises(EngineError, match="expected one image input"):
        binding_layout(engine, TRT)
