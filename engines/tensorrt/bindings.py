"""The engine's input/output tensors as TensorRT 10 reports them, sized for the largest batch.

Read through the name-based I/O API (`num_io_tensors`, `get_tensor_name`, `get_tensor_mode`,
`get_tensor_shape`, `get_tensor_dtype`, `get_tensor_profile_shape`); the `trt` module is passed
in, so the layout logic runs against any object with those names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.errors import EngineError


@dataclass(frozen=True, slots=True)
class Binding:
    name: str
    is_input: bool
    shape: tuple[int, ...]  # at the profile's max shape: what the buffers are sized for
    dtype: np.dtype[Any]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def per_item_shape(self) -> tuple[int, ...]:
        return self.shape[1:]


@dataclass(frozen=True, slots=True)
class BindingLayout:
    bindings: tuple[Binding, ...]
    input: Binding
    output: Binding  # the detection head's raw output

    @property
    def max_batch(self) -> int:
        return self.input.shape[0]


def binding_layout(engine: Any, trt: Any, context: Any = None, *, output_name: str | None = None) -> BindingLayout:
    """Bindings of `engine`; dynamic dims resolved from profile 0's max shape.

    Output shapes that depend on the input are asked of `context` after it was given the max
    input shape (TensorRT computes them there); an engine with only static shapes needs no context.
    """
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if n not in inputs]
    if len(inputs) != 1 or not outputs:
        raise EngineError(f"engine has inputs {inputs} and outputs {outputs}; expected one image input")
    input_name = inputs[0]
    input_shape = tuple(int(d) for d in engine.get_tensor_shape(input_name))
    if any(d < 0 for d in input_shape):
        input_shape = tuple(int(d) for d in engine.get_tensor_profile_shape(input_name, 0)[2])
        if context is None:
            raise EngineError(f"input {input_name!r} is dynamic; an execution context is needed for output shapes")
        if not context.set_input_shape(input_name, input_shape):
            raise EngineError(f"engine rejects its own max input shape {input_shape}")
    bindings = []
    for name in names:
        if name == input_name:
            shape = input_shape
        else:
            shape = tuple(int(d) for d in engine.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                shape = tuple(int(d) for d in context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise EngineError(f"output {name!r} has shape {shape} even at the max input shape")
        dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
        bindings.append(Binding(name, name == input_name, shape, dtype))
    by_name = {b.name: b for b in bindings}
    chosen = output_name if output_name is not None and output_name in outputs else outputs[0]
    return BindingLayout(tuple(bindings), by_name[input_name], by_name[chosen])
