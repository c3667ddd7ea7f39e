"""TensorRT 10 detector: engine cache, optimization profile, bindings, INT8 calibration, GPU letterbox.

Importing this package imports neither `tensorrt` nor `pycuda`: the modules that need them
take them as arguments or import them when an engine is opened, so the pure logic (cache keys,
profile shapes, binding layout, the letterbox arithmetic) runs and is tested on any machine.
"""

from engines.tensorrt.availability import INSTALL_HINT, tensorrt_available

__all__ = ["INSTALL_HINT", "tensorrt_available"]
