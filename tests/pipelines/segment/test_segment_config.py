"""The `segmentation:` section: off by default, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.capability import CapabilityError
from pipelines.segment.capability import open_segmentation
from realtime.config import Config, ConfigError, load_config


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(path, environ={})


def test_off_by_default(tmp_path: Path) -> None:
    config = load(tmp_path, "streams: []\n")
    assert config.segmentation.enabled is False


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ("{enabled: true}", "segmentation.enabled: needs sam_encoder"),
        ("{enabled: true, sam_encoder: e.onnx}", "segmentation.sam_decoder: required"),
        ("{enabled: true, yolo_seg: s.onnx, sam_encoder: e.onnx, sam_decoder: d.onnx}", "segmentation.yolo_seg"),
        ("{max_per_frame: 0}", "segmentation.max_per_frame"),
        ("{backend: cuda}", "segmentation.backend"),
        ("{cadence: 3}", "segmentation.cadence"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, section: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load(tmp_path, f"segmentation: {section}\n")


def test_settings_reach_the_stage(tmp_path: Path) -> None:
    config = load(tmp_path, "segmentation: {yolo_seg: s.onnx, every_frame_classes: [person], reseg_iou: 0.5}\n")
    settings = config.segmentation.to_settings()
    assert settings.every_frame_classes == frozenset({"person"}) and settings.reseg_iou == 0.5


async def test_a_missing_model_is_a_command_error_naming_the_section(tmp_path: Path) -> None:
    config = load(tmp_path, f"segmentation: {{enabled: true, yolo_seg: {tmp_path / 'nope.onnx'}, backend: onnx-cpu}}\n")
    with pytest.raises(CapabilityError, match="segmentation: .*nope.onnx: no such model file"):
        async with open_segmentation(config.segmentation):
            pass
