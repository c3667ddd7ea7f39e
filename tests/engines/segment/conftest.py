from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.segment import models


@pytest.fixture(scope="session")
def seg_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny models, built once per session."""
    root = tmp_path_factory.mktemp("seg-models")
    return {
        "sam_encoder": models.encoder(root / "sam_encoder.onnx"),
        "sam_decoder": models.sam_decoder(root / "sam_decoder.onnx"),
        "lowres_encoder": models.encoder(root / "lowres_encoder.onnx"),
        "lowres_decoder": models.sam_decoder(root / "lowres_decoder.onnx", low_res=True),
        "esam_encoder": models.encoder(root / "esam_encoder.onnx", input_name="batched_images", side=None),
        "esam_decoder": models.sam_decoder(root / "esam_decoder.onnx", efficient=True),
        "yolo_seg": models.yolo_seg(root / "yolo_seg.onnx"),
    }
