"""Segmentation engines: SAM-family box-prompted segmenters and YOLO-seg, on ONNX Runtime or
TensorRT, plus COCO RLE for the masks they make."""

from __future__ import annotations

from pathlib import Path

from engines.segment.types import Segmenter

SEGMENT_BACKENDS = ("auto", "tensorrt", "onnx-cuda", "onnx-cpu")


def pick_backend(backend: str) -> str:
    """`auto`: TensorRT when it can run here, else ONNX Runtime's CUDA EP, else CPU."""
    if backend != "auto":
        if backend not in SEGMENT_BACKENDS:
            raise ValueError(f"unknown segmentation backend {backend!r}; choose one of: {', '.join(SEGMENT_BACKENDS)}")
        return backend
    from engines.onnx_backend import cuda_ep_available
    from engines.tensorrt.availability import tensorrt_available

    if tensorrt_available()[0]:
        return "tensorrt"
    if cuda_ep_available()[0]:
        from engines.cuda_probe import cuda_device_count

        if cuda_device_count()[0] > 0:
            return "onnx-cuda"
    return "onnx-cpu"


def open_segmenter(
    *,
    sam_encoder: str | Path | None = None,
    sam_decoder: str | Path | None = None,
    yolo_seg: str | Path | None = None,
    backend: str = "auto",
    threads: int | None = None,
) -> Segmenter:
    """A SAM-family segmenter (encoder + decoder) or a YOLO-seg one (exactly one of the two)."""
    name = pick_backend(backend)
    if yolo_seg is not None:
        if sam_encoder is not None or sam_decoder is not None:
            raise ValueError("give either a SAM encoder + decoder or a YOLO-seg model, not both")
        from engines.segment.yolo_seg import open_yolo_seg

        return open_yolo_seg(yolo_seg, name, threads=threads)
    if sam_encoder is None or sam_decoder is None:
        raise ValueError("a SAM segmenter needs both an encoder and a decoder model")
    from engines.segment.sam import open_sam

    return open_sam(sam_encoder, sam_decoder, name, threads=threads)


__all__ = ["SEGMENT_BACKENDS", "Segmenter", "open_segmenter", "pick_backend"]
