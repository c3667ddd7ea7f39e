"""Does this machine have a usable NVIDIA GPU? Asked of the driver directly, so the answer needs
no CUDA Python package and costs a few milliseconds."""

from __future__ import annotations

import ctypes
import functools

_DRIVER_LIBS = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


@functools.cache
def cuda_device_count() -> tuple[int, str]:
    """(number of CUDA devices, a sentence saying what was found or why none)."""
    driver = None
    for name in _DRIVER_LIBS:
        try:
            driver = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if driver is None:
        return 0, "no NVIDIA driver (libcuda not found), so no CUDA device"
    status = driver.cuInit(0)
    if status != 0:
        return 0, f"the NVIDIA driver found no usable GPU (cuInit error {status})"
    count = ctypes.c_int(0)
    status = driver.cuDeviceGetCount(ctypes.byref(count))
    if status != 0 or count.value == 0:
        return 0, f"the NVIDIA driver reports no CUDA device (error {status})"
    return count.value, f"{count.value} CUDA device(s)"
