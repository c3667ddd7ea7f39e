"""The `segmentation:` config section, owned by the segmentation capability (off by default)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from pipelines.sections import MAX_THREADS, Section, default_of
from pipelines.segment.engine import SegmentSettings


def _segment(name: str) -> Any:
    return default_of(SegmentSettings, name)


class SegmentationSettings(Section):
    """Masks on tracked objects (off by default): a SAM-family encoder + decoder or a YOLO-seg export."""

    enabled: bool = False
    sam_encoder: Path | None = None  # SAM / MobileSAM / EfficientSAM image encoder ONNX
    sam_decoder: Path | None = None  # its prompt decoder ONNX
    yolo_seg: Path | None = None  # or an Ultralytics YOLO-seg ONNX export
    backend: Literal["auto", "tensorrt", "onnx-cuda", "onnx-cpu"] = "auto"
    threads: int | None = Field(None, ge=1, le=MAX_THREADS)
    reseg_iou: float = Field(_segment("reseg_iou"), gt=0, le=1)  # a track's box moved this much: new mask
    max_per_frame: int = Field(_segment("max_per_frame"), ge=1, le=64)
    every_frame_classes: list[str] = []  # classes segmented on every frame, not only when new or changed

    @model_validator(mode="after")
    def _models(self) -> SegmentationSettings:
        if not self.enabled:
            return self
        sam = self.sam_encoder is not None or self.sam_decoder is not None
        if sam and self.yolo_seg is not None:
            raise ValueError("segmentation.yolo_seg: give either it or sam_encoder + sam_decoder, not both")
        if self.sam_encoder is not None and self.sam_decoder is None:
            raise ValueError("segmentation.sam_decoder: required with sam_encoder")
        if self.sam_decoder is not None and self.sam_encoder is None:
            raise ValueError("segmentation.sam_encoder: required with sam_decoder")
        if not sam and self.yolo_seg is None:
            raise ValueError("segmentation.enabled: needs sam_encoder + sam_decoder or yolo_seg")
        return self

    def to_settings(self) -> SegmentSettings:
        return SegmentSettings(
            reseg_iou=self.reseg_iou,
            max_per_frame=self.max_per_frame,
            every_frame_classes=frozenset(self.every_frame_classes),
        )
