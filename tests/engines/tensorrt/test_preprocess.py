"""The GPU letterbox's arithmetic: its numpy reference against the CPU detector's letterbox, and
(on a GPU with pycuda and nvcc) the kernel against the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.detector import PAD_VALUE, Letterbox, YoloDetector
from engines.onnx_backend import OnnxRuntimeBackend
from engines.parity import compare
from engines.tensorrt.preprocess import letterbox_reference

ONE_LEVEL = 1 / 255 + 1e-6  # cv2 resizes in 11-bit fixed point: at most one grey level apart
SIZES = [((576, 768), (640, 640)), ((170, 320), (320, 320)), ((100, 50), (640, 640)), ((7, 3), (64, 64)),
         ((480, 640), (480, 640)), ((1080, 1920), (384, 640))]


def cpu_letterbox(image: np.ndarray, dst_hw: tuple[int, int]) -> np.ndarray:
    from engines.detector import letterbox_image

    canvas = np.full((*dst_hw, 3), PAD_VALUE, np.uint8)
    letterbox_image(image, Letterbox.fit(image.shape[:2], dst_hw), canvas)
    return canvas.transpose(2, 0, 1).astype(np.float32) * np.float32(1 / 255)


@pytest.mark.parametrize(("src_hw", "dst_hw"), SIZES)
def test_reference_matches_the_cpu_letterbox(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(src_hw))
    image = rng.integers(0, 256, (*src_hw, 3), dtype=np.uint8)
    box = Letterbox.fit(src_hw, dst_hw)
    reference = letterbox_reference(image, box)
    assert reference.shape == (3, *dst_hw) and reference.dtype == np.float32
    np.testing.assert_allclose(reference, cpu_letterbox(image, dst_hw), rtol=0, atol=ONE_LEVEL)
    left, top = box.pad
    rh, rw = box.resized_hw
    pad = np.float32(PAD_VALUE) * np.float32(1 / 255)
    outside = np.ones(dst_hw, bool)
    outside[top : top + rh, left : left + rw] = False
    assert np.all(reference[:, outside] == pad)


def test_reference_matches_the_detector_on_a_real_frame(
    vtest_frames: dict[int, np.ndarray], nudenet_detector: YoloDetector
) -> None:
    frame = vtest_frames[50]
    tensor = nudenet_detector.preprocess([frame]).tensor[0]
    box = Letterbox.fit(frame.shape[:2], nudenet_detector.info.imgsz)
    np.testing.assert_allclose(letterbox_reference(frame, box), tensor, rtol=0, atol=ONE_LEVEL)


class ReferenceLetterboxBackend:
    """ONNX Runtime behind the on-device letterbox interface, letterboxing with the kernel's numpy
    reference: detect() takes the same branch it takes for TensorRT."""

    letterbox_on_device = True
    name = "reference-letterbox"
    max_batch: int | None = None

    def __init__(self, model: Path, imgsz: tuple[int, int]) -> None:
        self._ort = OnnxRuntimeBackend(model, "cpu", threads=1)
        self.input_name = self._ort.input_name
        self._imgsz = imgsz
        self.calls = 0

    def infer_images(self, images: list[np.ndarray]) -> tuple[np.ndarray, tuple[Letterbox, ...]]:
        self.calls += 1
        boxes = tuple(Letterbox.fit(image.shape[:2], self._imgsz) for image in images)
        tensor = np.stack([letterbox_reference(image, box) for image, box in zip(images, boxes, strict=True)])
        return self._ort.infer(tensor), boxes

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self._ort.infer(batch)

    def close(self) -> None:
        self._ort.close()


def test_detect_through_the_device_letterbox_path_gives_the_cpu_boxes(
    vtest_frames: dict[int, np.ndarray], people_crops: list[np.ndarray], nudenet_detector: YoloDetector,
    nudenet_model: Path,
) -> None:
    images = [*vtest_frames.values(), *people_crops]
    info = nudenet_detector.info
    backend = ReferenceLetterboxBackend(nudenet_model, info.imgsz)
    device_path = YoloDetector(backend, info, conf=nudenet_detector.conf, max_batch=4)
    try:
        got = device_path.detect(images)
    finally:
        device_path.close()
    assert backend.calls == 2  # 6 images in chunks of max_batch 4
    report = compare(nudenet_detector.detect(images), got, reference_name="cpu", candidate_name="reference",
                     reference_ms=0, candidate_ms=0)
    assert report.matched > 0 and report.agree, report.verdict()


def test_reference_refuses_a_mismatched_image() -> None:
    with pytest.raises(ValueError, match="does not match"):
        letterbox_reference(np.zeros((10, 10, 3), np.uint8), Letterbox.fit((20, 10), (32, 32)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_kernel_matches_the_reference(dtype: type, vtest_frames: dict[int, np.ndarray]) -> None:
    cuda = pytest.importorskip("pycuda.driver")
    compiler = pytest.importorskip("pycuda.compiler")
    from engines.cuda_probe import cuda_device_count
    from engines.tensorrt.preprocess import GpuLetterbox

    if cuda_device_count()[0] == 0:
        pytest.skip("no CUDA device")
    cuda.init()
    context = cuda.Device(0).retain_primary_context()
    context.push()
    try:
        stream = cuda.Stream()
        dst_hw = (320, 320)
        rows = 3
        images = [vtest_frames[0], np.ascontiguousarray(vtest_frames[100][130:300, 320:640])]
        letterbox = GpuLetterbox(cuda, compiler.SourceModule, dst_hw=dst_hw, dtype=np.dtype(dtype), slots=rows,
                                 stream=stream, frame_bytes=1024)  # small: the first frame grows the slots
        out = cuda.mem_alloc(rows * 3 * 320 * 320 * np.dtype(dtype).itemsize)
        boxes = letterbox.run(images, int(out), rows)
        host: np.ndarray = np.empty((rows, 3, *dst_hw), dtype)
        cuda.memcpy_dtoh_async(host, out, stream)
        stream.synchronize()
        tolerance = 1e-6 if dtype == np.float32 else 2e-3
        for i, image in enumerate(images):
            np.testing.assert_allclose(host[i].astype(np.float32), letterbox_reference(image, boxes[i]),
                                       rtol=0, atol=tolerance)
        pad = np.float32(PAD_VALUE) / 255
        np.testing.assert_allclose(host[2].astype(np.float32), np.full((3, *dst_hw), pad), rtol=0, atol=tolerance)
        letterbox.close()
        out.free()
    finally:
        context.pop()
        context.detach()
