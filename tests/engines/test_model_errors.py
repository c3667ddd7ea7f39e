"""Bad model files fail with ModelLoadError naming the file and the problem, in one line."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from engines.errors import EngineError, ModelLoadError
from engines.model_info import read_model_info
from engines.registry import create_detector

YOLO_META = {"task": "detect", "names": "{0: 'a', 1: 'b'}", "imgsz": "[64, 64]", "stride": "32"}


def write_model(
    path: Path,
    *,
    metadata: dict[str, str] | None = None,
    input_shape: list[int | str] | None = None,
    output_shape: list[int | str] | None = None,
) -> Path:
    """A tiny valid ONNX graph (one Identity node) with the given signature and metadata."""
    input_shape = input_shape or [1, 3, 64, 64]
    output_shape = output_shape or input_shape
    graph = helper.make_graph(
        [helper.make_node("Identity", ["images"], ["output0"])],
        "tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, output_shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))
    return path


def assert_one_line_error(path: Path, match: str) -> None:
    with pytest.raises(ModelLoadError, match=match) as caught:
        create_detector(path, "onnx-cpu")
    message = str(caught.value)
    assert str(path) in message and "\n" not in message
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, EngineError)


def test_missing_file(tmp_path: Path) -> None:
    assert_one_line_error(tmp_path / "nope.onnx", "no such model file")


def test_directory(tmp_path: Path) -> None:
    assert_one_line_error(tmp_path, "is not a file")


def test_text_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_text("this is a text file, not a model\n")
    assert_one_line_error(path, "is not an ONNX model")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    assert_one_line_error(path, "is not an ONNX model")


def test_valid_onnx_without_yolo_metadata(tmp_path: Path) -> None:
    assert_one_line_error(write_model(tmp_path / "plain.onnx"), "no 'names' metadata.*not an Ultralytics YOLO")


def test_segment_export_without_prototypes_is_refused(tmp_path: Path) -> None:
    path = write_model(tmp_path / "seg.onnx", metadata={**YOLO_META, "task": "segment"})
    assert_one_line_error(path, "'segment' export but has no second output")


def test_other_tasks_are_refused(tmp_path: Path) -> None:
    path = write_model(tmp_path / "pose.onnx", metadata={**YOLO_META, "task": "pose"})
    assert_one_line_error(path, "'pose' export; only 'detect' and 'segment'")


def test_wrong_output_shape(tmp_path: Path) -> None:
    path = write_model(tmp_path / "v5.onnx", metadata=YOLO_META, input_shape=[1, 3, 64, 64])
    assert_one_line_error(path, r"output 'output0' has shape \[1, 3, 64, 64\], expected \[batch, 6, anchors\]")


def test_end_to_end_export_is_refused(tmp_path: Path) -> None:
    path = write_model(
        tmp_path / "e2e.onnx",
        metadata={**YOLO_META, "args": "{'nms': True}"},
        output_shape=[1, 300, 6],
    )
    assert_one_line_error(path, "nms=True")


def test_names_are_never_evaluated(tmp_path: Path) -> None:
    path = write_model(tmp_path / "evil.onnx", metadata={**YOLO_META, "names": "__import__('os').getcwd()"})
    assert_one_line_error(path, "'names' is not a non-empty dict")


def test_bad_input_shape(tmp_path: Path) -> None:
    path = write_model(tmp_path / "gray.onnx", metadata=YOLO_META, input_shape=[1, 1, 64, 64])
    assert_one_line_error(path, r"input 'images' has shape \[1, 1, 64, 64\]")


def test_minimal_valid_export_is_accepted(tmp_path: Path) -> None:
    # A [1, 6, 8] output is a well-formed 2-class detect signature; dynamic dims fall back to imgsz.
    path = write_model(
        tmp_path / "ok.onnx",
        metadata={**YOLO_META, "imgsz": "[96, 128]"},
        input_shape=["batch", 3, "h", "w"],
        output_shape=["batch", 6, "anchors"],
    )
    info = read_model_info(path)
    assert info.names == {0: "a", 1: "b"} and info.imgsz == (96, 128)
    assert info.fixed_batch is None and info.dynamic_hw
