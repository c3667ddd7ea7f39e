"""The letterbox kernel's own source, without a GPU: nvcc compiles it for the device (when the CUDA
toolkit is here), and g++ runs its thread body on the host over every (block, thread) of the grid,
with the CUDA rounding intrinsics as IEEE single-precision operations. The host run must equal
the numpy reference bit for bit; the reference is checked against the CPU letterbox elsewhere."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engines.detector import PAD_VALUE, Letterbox
from engines.tensorrt.preprocess import BLOCK, KERNEL_SOURCE, kernel_scales, letterbox_reference

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
struct Dim { int x, y, z; };
static Dim blockIdx, blockDim, threadIdx;
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
struct __half { float v; };
inline __half __float2half_rn(float v) { return __half{v}; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
#include "kernel.inc"
int main(int argc, char** argv) {
    int h = atoi(argv[1]), w = atoi(argv[2]), dh = atoi(argv[3]), dw = atoi(argv[4]);
    int rh = atoi(argv[5]), rw = atoi(argv[6]), left = atoi(argv[7]), top = atoi(argv[8]);
    float sx = strtof(argv[9], 0), sy = strtof(argv[10], 0), pad = strtof(argv[11], 0);
    std::vector<unsigned char> src((size_t)h * w * 3 + 1);
    FILE* f = fopen(argv[12], "rb");
    if (fread(src.data(), 1, (size_t)h * w * 3, f) != (size_t)h * w * 3) return 3;
    fclose(f);
    std::vector<float> dst((size_t)3 * dh * dw, -1.0f);
    blockDim = {BX, BY, 1};
    for (int by = 0; by < (dh + BY - 1) / BY; ++by)
        for (int bx = 0; bx < (dw + BX - 1) / BX; ++bx)
            for (int ty = 0; ty < BY; ++ty)
                for (int tx = 0; tx < BX; ++tx) {
                    blockIdx = {bx, by, 0};
                    threadIdx = {tx, ty, 0};
                    letterbox_f32(src.data(), h, w, w * 3, dst.data(), dh, dw, rh, rw, left, top, sx, sy, pad);
                }
    f = fopen(argv[13], "wb");
    fwrite(dst.data(), 4, dst.size(), f);
    fclose(f);
    return 0;
}
"""


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed")
    work = tmp_path_factory.mktemp("kernel")
    (work / "kernel.inc").write_text(KERNEL_SOURCE.replace("#include <cuda_fp16.h>", ""))
    (work / "harness.cpp").write_text(HARNESS)
    binary = work / "letterbox"
    subprocess.run(
        [compiler, "-O2", "-ffp-contract=off", f"-DBX={BLOCK[0]}", f"-DBY={BLOCK[1]}", "-o", str(binary),
         str(work / "harness.cpp")],
        check=True, capture_output=True, cwd=work,
    )
    return binary


def run_on_host(binary: Path, image: np.ndarray, box: Letterbox | None, dst_hw: tuple[int, int]) -> np.ndarray:
    """One launch of the kernel; box None is a padding row (rw = rh = 0)."""
    work = binary.parent
    image.tofile(work / "in.raw")
    if box is None:
        h, w, rh, rw, left, top, sx, sy = image.shape[0], image.shape[1], 0, 0, 0, 0, np.float32(1), np.float32(1)
    else:
        (h, w), (rh, rw), (left, top) = box.src_hw, box.resized_hw, box.pad
        sx, sy = kernel_scales(box)
    pad = np.float32(PAD_VALUE) * np.float32(1 / 255)
    args = [str(v) for v in (h, w, *dst_hw, rh, rw, left, top)]
    args += [repr(float(v)) for v in (sx, sy, pad)] + [str(work / "in.raw"), str(work / "out.raw")]
    subprocess.run([str(binary), *args], check=True)
    return np.fromfile(work / "out.raw", np.float32).reshape(3, *dst_hw)


@pytest.mark.parametrize(("src_hw", "dst_hw"), [((576, 768), (640, 640)), ((7, 3), (64, 64)), ((90, 200), (64, 96))])
def test_kernel_body_equals_the_reference(host_kernel: Path, src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> None:
    image = np.random.default_rng(7).integers(0, 256, (*src_hw, 3), dtype=np.uint8)
    box = Letterbox.fit(src_hw, dst_hw)
    np.testing.assert_array_equal(run_on_host(host_kernel, image, box, dst_hw), letterbox_reference(image, box))


def test_padding_row_is_all_gray(host_kernel: Path) -> None:
    out = run_on_host(host_kernel, np.zeros((4, 4, 3), np.uint8), None, (32, 64))
    assert np.all(out == np.float32(PAD_VALUE) * np.float32(1 / 255))


def test_nvcc_compiles_both_kernels(tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("the CUDA toolkit (nvcc) is not installed")
    (tmp_path / "kernel.cu").write_text(KERNEL_SOURCE)
    # What pycuda's SourceModule(no_extern_c=True) runs, for one current architecture.
    subprocess.run([nvcc, "--cubin", "-arch", "sm_80", "-O3", "kernel.cu", "-o", "kernel.cubin"],
                   check=True, capture_output=True, cwd=tmp_path)
    names = (tmp_path / "kernel.cubin").read_bytes()
    assert b"letterbox_f32" in names and b"letterbox_f16" in names  # unmangled: get_function finds them
