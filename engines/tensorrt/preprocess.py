"""Letterbox + normalise on the GPU, straight into the engine's input binding.

One thread per model-input pixel: inside the resized area it samples the uint8 RGB frame
bilinearly (half-pixel centres, edge-clamped: cv2.INTER_LINEAR's geometry), rounds to uint8 as
the CPU path's canvas does, scales by 1/255 and writes the three planes (NCHW, float32 or
float16); outside it writes the pad gray. `letterbox_reference` is the same arithmetic in numpy,
so the kernel can be checked against it on a GPU and the reference against the CPU path anywhere.

Frames arrive as numpy arrays (see realtime/sources/decode.py for why even NVDEC frames do): each
one is copied into a pinned staging slot and uploaded with one async copy into a preallocated
device slot. Slots grow only when a frame larger than any before arrives, so a stream of
constant size allocates nothing per frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engines.detector import PAD_VALUE, Letterbox

BLOCK = (32, 8, 1)
DEFAULT_FRAME_BYTES = 1920 * 1080 * 3  # slots start at 1080p; a larger frame grows them once

KERNEL_SOURCE = r"""
#include <cuda_fp16.h>

__device__ __forceinline__ float to_float_out(float v, float*) { return v; }
__device__ __forceinline__ __half to_float_out(float v, __half*) { return __float2half_rn(v); }

template <typename T>
__device__ void letterbox(const unsigned char* __restrict__ src, int src_h, int src_w, int src_pitch,
                          T* __restrict__ dst, int dst_h, int dst_w, int rh, int rw, int left, int top,
                          float scale_x, float scale_y, float pad) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= dst_w || y >= dst_h) return;
    const size_t plane = (size_t)dst_h * dst_w;
    const size_t at = (size_t)y * dst_w + x;
    const int rx = x - left, ry = y - top;
    if (rx < 0 || ry < 0 || rx >= rw || ry >= rh) {
        const T p = to_float_out(pad, (T*)0);
        dst[at] = p; dst[at + plane] = p; dst[at + 2 * plane] = p;
        return;
    }
    float fx = __fsub_rn(__fmul_rn(__fadd_rn((float)rx, 0.5f), scale_x), 0.5f);
    int x0 = (int)floorf(fx);
    fx = __fsub_rn(fx, (float)x0);
    if (x0 < 0) { x0 = 0; fx = 0.0f; }
    int x1 = x0 + 1;
    if (x0 >= src_w - 1) { x0 = src_w - 1; x1 = x0; fx = 0.0f; }
    float fy = __fsub_rn(__fmul_rn(__fadd_rn((float)ry, 0.5f), scale_y), 0.5f);
    int y0 = (int)floorf(fy);
    fy = __fsub_rn(fy, (float)y0);
    if (y0 < 0) { y0 = 0; fy = 0.0f; }
    int y1 = y0 + 1;
    if (y0 >= src_h - 1) { y0 = src_h - 1; y1 = y0; fy = 0.0f; }
    const unsigned char* r0 = src + (size_t)y0 * src_pitch;
    const unsigned char* r1 = src + (size_t)y1 * src_pitch;
    const float gx = __fsub_rn(1.0f, fx), gy = __fsub_rn(1.0f, fy);
    for (int c = 0; c < 3; ++c) {
        // Separate roundings (no fused multiply-add) so the numpy reference reproduces every step.
        const float a = __fadd_rn(__fmul_rn((float)r0[x0 * 3 + c], gx), __fmul_rn((float)r0[x1 * 3 + c], fx));
        const float b = __fadd_rn(__fmul_rn((float)r1[x0 * 3 + c], gx), __fmul_rn((float)r1[x1 * 3 + c], fx));
        float v = floorf(__fadd_rn(__fadd_rn(__fmul_rn(a, gy), __fmul_rn(b, fy)), 0.5f));
        v = fminf(fmaxf(v, 0.0f), 255.0f);
        dst[at + c * plane] = to_float_out(__fmul_rn(v, 1.0f / 255.0f), (T*)0);
    }
}

extern "C" __global__ void letterbox_f32(const unsigned char* src, int src_h, int src_w, int src_pitch,
        float* dst, int dst_h, int dst_w, int rh, int rw, int left, int top,
        float scale_x, float scale_y, float pad) {
    letterbox<float>(src, src_h, src_w, src_pitch, dst, dst_h, dst_w, rh, rw, left, top, scale_x, scale_y, pad);
}

extern "C" __global__ void letterbox_f16(const unsigned char* src, int src_h, int src_w, int src_pitch,
        __half* dst, int dst_h, int dst_w, int rh, int rw, int left, int top,
        float scale_x, float scale_y, float pad) {
    letterbox<__half>(src, src_h, src_w, src_pitch, dst, dst_h, dst_w, rh, rw, left, top, scale_x, scale_y, pad);
}
"""
KERNEL_ARGS = "PiiiPiiiiiifff"  # pycuda prepare(): pointers, ints and floats in the kernels' order


def kernel_scales(box: Letterbox) -> tuple[np.float32, np.float32]:
    """Source pixels per resized pixel, as the kernel receives them (float32)."""
    (h, w), (rh, rw) = box.src_hw, box.resized_hw
    return np.float32(w / rw), np.float32(h / rh)


def _axis(size: int, resized: int, scale: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per resized index: the two source indices and the weight of the second, as the kernel does."""
    f = (np.arange(resized, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    i0 = np.floor(f).astype(np.int64)
    frac = (f - i0.astype(np.float32)).astype(np.float32)
    low = i0 < 0
    i0[low], frac[low] = 0, 0
    i1 = i0 + 1
    high = i0 >= size - 1
    i0[high], i1[high], frac[high] = size - 1, size - 1, 0
    return i0, i1, frac


def letterbox_reference(image: np.ndarray, box: Letterbox) -> np.ndarray:
    """The kernel's output for one RGB uint8 image: (3, H, W) float32."""
    (h, w), (dh, dw), (rh, rw) = box.src_hw, box.dst_hw, box.resized_hw
    if image.shape != (h, w, 3) or image.dtype != np.uint8:
        raise ValueError(f"image {image.shape} {image.dtype} does not match letterbox source {box.src_hw}")
    left, top = box.pad
    scale_x, scale_y = kernel_scales(box)
    x0, x1, fx = _axis(w, rw, scale_x)
    y0, y1, fy = _axis(h, rh, scale_y)
    px = image.astype(np.float32)
    gx = (np.float32(1) - fx)[None, :, None]
    fxc = fx[None, :, None]

    def across(rows: np.ndarray) -> np.ndarray:
        return (px[rows][:, x0] * gx).astype(np.float32) + (px[rows][:, x1] * fxc).astype(np.float32)

    a, b = across(y0), across(y1)
    gy = (np.float32(1) - fy)[:, None, None]
    value = (a * gy).astype(np.float32) + (b * fy[:, None, None]).astype(np.float32)
    value = np.clip(np.floor(value + np.float32(0.5)), 0, 255).astype(np.float32)
    out = np.full((3, dh, dw), np.float32(PAD_VALUE) * np.float32(1 / 255), np.float32)
    out[:, top : top + rh, left : left + rw] = (value * np.float32(1 / 255)).transpose(2, 0, 1)
    return out


class GpuLetterbox:
    """Uploads RGB frames and letterboxes them into a device tensor (the engine's input binding).

    `cuda` is pycuda.driver and `source_module` pycuda.compiler.SourceModule (passed in so this
    module imports without a GPU). Calls must run with the engine's CUDA context current and
    are ordered on `stream`; the caller synchronises before reusing the staging slots.
    """

    def __init__(
        self,
        cuda: Any,
        source_module: Any,
        *,
        dst_hw: tuple[int, int],
        dtype: np.dtype[Any],
        slots: int,
        stream: Any,
        frame_bytes: int = DEFAULT_FRAME_BYTES,
    ) -> None:
        if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float16)):
            raise ValueError(f"the GPU letterbox writes float32 or float16, not {dtype}")
        self._cuda, self._stream = cuda, stream
        self.dst_hw = dst_hw
        self._itemsize = np.dtype(dtype).itemsize
        module = source_module(KERNEL_SOURCE, no_extern_c=True, options=["-O3"])
        name = "letterbox_f16" if np.dtype(dtype) == np.float16 else "letterbox_f32"
        self._kernel = module.get_function(name)
        self._kernel.prepare(KERNEL_ARGS)
        self._module = module  # keeps the kernel's code loaded
        self._slots = slots
        self._capacity = 0
        self._host: list[Any] = []
        self._device: list[Any] = []
        self._grow(frame_bytes)

    def _grow(self, nbytes: int) -> None:
        for allocation in self._device:
            allocation.free()
        self._capacity = nbytes
        self._host = [self._cuda.pagelocked_empty(nbytes, np.uint8) for _ in range(self._slots)]
        self._device = [self._cuda.mem_alloc(nbytes) for _ in range(self._slots)]

    def run(self, images: Sequence[np.ndarray], dst_ptr: int, rows: int) -> tuple[Letterbox, ...]:
        """Letterbox `images` into rows 0.. of the NCHW tensor at `dst_ptr`; rows past the images
        (a fixed-batch model's padding) get the pad gray. Asynchronous on the stream."""
        if not rows or len(images) > rows or rows > self._slots:
            raise ValueError(f"{len(images)} images for {rows} rows of {self._slots}")
        largest = max((image.nbytes for image in images), default=0)
        if largest > self._capacity:
            self._stream.synchronize()  # earlier uploads may still read the old slots
            self._grow(largest)
        dh, dw = self.dst_hw
        row_bytes = 3 * dh * dw * self._itemsize
        grid = ((dw + BLOCK[0] - 1) // BLOCK[0], (dh + BLOCK[1] - 1) // BLOCK[1], 1)
        pad = np.float32(PAD_VALUE) * np.float32(1 / 255)
        boxes = []
        for row in range(rows):
            src = self._device[row]
            if row < len(images):
                image = images[row]
                box = Letterbox.fit(image.shape[:2], self.dst_hw)
                staging = self._host[row][: image.nbytes].reshape(image.shape)
                np.copyto(staging, image)  # also makes a strided view contiguous
                self._cuda.memcpy_htod_async(src, staging, self._stream)
                (h, w), (rh, rw) = box.src_hw, box.resized_hw
                left, top = box.pad
                scale_x, scale_y = kernel_scales(box)
                boxes.append(box)
            else:  # rw = rh = 0: every pixel is padding, the source is not read
                h = w = rh = rw = left = top = 0
                scale_x = scale_y = np.float32(1)
            self._kernel.prepared_async_call(
                grid, BLOCK, self._stream,
                int(src), np.int32(h), np.int32(w), np.int32(w * 3),
                int(dst_ptr) + row * row_bytes, np.int32(dh), np.int32(dw),
                np.int32(rh), np.int32(rw), np.int32(left), np.int32(top),
                scale_x, scale_y, pad,
            )
        return tuple(boxes)

    def close(self) -> None:
        for allocation in self._device:
            allocation.free()
        self._device, self._host = [], []
