"""INT8 on CPU: the real nudenet 320n model statically quantized on vtest frames, built once."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from engines import int8_agreement, quantize
from engines.detector import YoloDetector
from engines.errors import EngineUnavailable
from engines.models import ModelNotFound
from engines.quantize import QuantizeSettings, cache_path, head_nodes, int8_model, letterbox_tensor, report_path
from engines.registry import create_detector

SETTINGS = QuantizeSettings(frames=6)  # enough to calibrate 320n sanely, fast to build


@pytest.fixture(scope="module")
def int8_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("int8")


CALIBRATION_READS: list[int] = []  # frames read by each of the calibrator's collections, in the build below


@pytest.fixture(scope="module")
def int8_path(nudenet_model: Path, vtest_avi: Path, int8_cache: Path) -> Path:
    from onnxruntime.quantization import calibrate

    read = [0]
    collect, get_next = calibrate.HistogramCalibrater.collect_data, quantize.CalibrationFrames.get_next

    def counted_next(self: quantize.CalibrationFrames) -> dict[str, np.ndarray] | None:
        item = get_next(self)
        read[0] += item is not None
        return item

    def counted_collect(self: calibrate.HistogramCalibrater, reader: calibrate.CalibrationDataReader) -> None:
        before = read[0]
        collect(self, reader)
        CALIBRATION_READS.append(read[0] - before)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize.CalibrationFrames, "get_next", counted_next)
        patch.setattr(calibrate.HistogramCalibrater, "collect_data", counted_collect)
        return int8_model(nudenet_model, calibration_video=vtest_avi, settings=SETTINGS, cache_dir=int8_cache)


@pytest.fixture(scope="module")
def int8_detector(
    nudenet_model: Path, vtest_avi: Path, int8_path: Path, int8_cache: Path
) -> Iterator[YoloDetector]:
    # create_detector quantizes with the default settings into the default cache; point both at
    # this module's build so the model is built once.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize, "DEFAULT_CACHE_DIR", int8_cache)
        patch.setattr(quantize, "DEFAULT_SETTINGS", SETTINGS)
        detector = create_detector(nudenet_model, "onnx-cpu", precision="int8", calibration=vtest_avi, conf=0.01)
    assert isinstance(detector, YoloDetector)
    yield detector
    detector.close()


def test_the_model_is_quantized_in_qdq_form_with_the_box_decode_left_in_float(int8_path: Path) -> None:
    model = onnx.load(str(int8_path))
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("QuantizeLinear") > 50 and ops.count("DequantizeLinear") > 50
    producers = {out: node for node in model.graph.node for out in node.output}
    convs = [node for node in model.graph.node if node.op_type == "Conv"]
    quantized = [c for c in convs if getattr(producers.get(c.input[1]), "op_type", "") == "DequantizeLinear"]
    assert len(quantized) >= len(convs) - 1  # every conv but the DFL's runs on int8 weights
    softmax = next(node for node in model.graph.node if node.op_type == "Softmax")
    assert producers[softmax.input[0]].op_type != "DequantizeLinear"
    assert producers[model.graph.output[0].name].op_type == "Concat"
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["vidsentry_quantized"] == "int8-qdq" and "names" in meta


def test_calibration_holds_one_batch_of_frames_at_a_time(int8_path: Path) -> None:
    # The histogram calibrators keep every activation of the frames of one collection: all 32
    # frames at once took 13.5-15.2 GB for the people model. Each collection gets `batch` frames
    # and merges its histograms into the last.
    assert SETTINGS.batch == QuantizeSettings().batch == 1
    reads = list(CALIBRATION_READS)
    assert reads == [1] * SETTINGS.frames


def test_a_second_call_reuses_the_cached_file(
    nudenet_model: Path, vtest_avi: Path, int8_path: Path, int8_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_calibration(self: quantize.CalibrationFrames) -> None:
        raise AssertionError("a cached model was calibrated again")

    monkeypatch.setattr(quantize.CalibrationFrames, "get_next", no_calibration)
    before = int8_path.stat().st_ino
    again = int8_model(nudenet_model, calibration_video=vtest_avi, settings=SETTINGS, cache_dir=int8_cache)
    assert again == int8_path
    assert again.stat().st_ino == before  # a rebuild would have replaced the file
    # No build leftovers: the model and what its build measured.
    assert sorted(p.name for p in int8_cache.iterdir()) == sorted([int8_path.name, report_path(int8_path).name])


def test_an_unwritable_cache_says_where_and_what_to_set(nudenet_model: Path, vtest_avi: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(EngineUnavailable, match="cannot write the INT8 model cache at .*XDG_CACHE_HOME"):
        int8_model(nudenet_model, calibration_video=vtest_avi, settings=SETTINGS, cache_dir=tmp_path / "file" / "int8")


def test_the_cache_keeps_the_most_recently_used_models(tmp_path: Path) -> None:
    for age, name in enumerate(["c", "b", "a"]):
        (tmp_path / f"{name}-int8-0.onnx").write_bytes(b"x")
        os.utime(tmp_path / f"{name}-int8-0.onnx", (1000 - age, 1000 - age))
    (tmp_path / "notes.txt").write_text("not a model")
    removed = quantize.prune(tmp_path, keep=2)
    assert [p.name for p in removed] == ["a-int8-0.onnx"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b-int8-0.onnx", "c-int8-0.onnx", "notes.txt"]


def test_the_cache_bound_counts_refusals_and_takes_reports_with_their_models(tmp_path: Path) -> None:
    names = ["c-int8-0.onnx", "c-int8-0.json", "b-int8-0.rejected.json", "a-int8-0.onnx", "a-int8-0.json"]
    for age, name in enumerate(names):
        (tmp_path / name).write_text("{}")
        os.utime(tmp_path / name, (1000 - age, 1000 - age))
    removed = quantize.prune(tmp_path, keep=1)
    assert sorted(p.name for p in removed) == ["a-int8-0.onnx", "b-int8-0.rejected.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c-int8-0.json", "c-int8-0.onnx"]


def test_settings_the_model_and_the_clip_each_change_the_key(
    nudenet_model: Path, fall_model: Path, vtest_avi: Path, sample_clip: Path, int8_path: Path, *, int8_cache: Path
) -> None:
    keys = {
        cache_path(nudenet_model, vtest_avi, replace(SETTINGS, calibration="entropy"), int8_cache),
        cache_path(nudenet_model, vtest_avi, replace(SETTINGS, per_channel=False), int8_cache),
        cache_path(nudenet_model, vtest_avi, replace(SETTINGS, frames=7), int8_cache),
        cache_path(nudenet_model, sample_clip, SETTINGS, int8_cache),
        cache_path(fall_model, vtest_avi, SETTINGS, int8_cache),
    }
    assert len(keys) == 5 and int8_path not in keys
    assert cache_path(nudenet_model, vtest_avi, SETTINGS, int8_cache) == int8_path


def test_int8_finds_the_boxes_fp32_finds(
    int8_detector: YoloDetector,
    nudenet_detector: YoloDetector,
    people_crops: list[np.ndarray],
    vtest_frames: dict[int, np.ndarray],
) -> None:
    """The build checked its copy against FP32 on its calibration frames, on this CPU, and kept a
    variant that holds the bound. On other pictures (crops it never saw), FP32's boxes (conf 0.05)
    read as that check reads them (the copy's down to half the threshold): a 6-frame calibration
    of 320n finds most, 7 of 8 here."""
    assert int8_detector.backend == "onnxruntime-cpu"
    assert int8_detector.info.names == nudenet_detector.info.names
    images = [*people_crops, vtest_frames[0], vtest_frames[50]]
    # Calibrated on exactly what the detector feeds the model.
    assert np.array_equal(letterbox_tensor(images[0], (320, 320)), nudenet_detector.preprocess(images[:1]).tensor)
    reference = nudenet_detector.detect(images)
    found = int8_detector.detect(images)
    agreement = int8_agreement.compare(reference, found, 0.05)
    assert agreement.fp32_boxes >= 6  # enough boxes for the fraction to mean something
    assert agreement.recall >= 0.75, agreement.describe()


def test_the_build_kept_a_variant_that_holds_on_this_cpu(int8_path: Path) -> None:
    built = json.loads(report_path(int8_path).read_text())
    kept = built["agreements"][-1]
    assert kept["variant"] == built["variant"]
    assert kept["recall"] >= int8_agreement.MIN_RECALL and kept["drift"] <= int8_agreement.MAX_DRIFT
    assert all(a["recall"] < int8_agreement.MIN_RECALL or a["drift"] > int8_agreement.MAX_DRIFT
               for a in built["agreements"][:-1])  # those tried before it did not hold
    assert built["cpu"] == list(int8_agreement.cpu_int8_features())


def test_a_copy_built_for_other_cpu_features_is_not_taken(
    nudenet_model: Path, vtest_avi: Path, int8_path: Path, int8_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = int8_agreement.cpu_int8_features()
    monkeypatch.setattr(quantize, "cpu_int8_features", lambda: ("avx2",) if here != ("avx2",) else ("avx512f",))
    assert cache_path(nudenet_model, vtest_avi, SETTINGS, int8_cache) != int8_path


def test_when_no_variant_holds_the_build_says_so_and_remembers(
    nudenet_model: Path, vtest_avi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried: list[str] = []

    def disagreeing(self: int8_agreement.Reference, built: Path) -> int8_agreement.Agreement:
        tried.append(onnx.load(str(built)).graph.name or "built")
        return int8_agreement.Agreement(recall=0.9, precision=0.9, drift=0.01, fp32_boxes=40, int8_boxes=38,
                                        conf=0.25)

    monkeypatch.setattr(int8_agreement.Reference, "measure", disagreeing)
    settings = QuantizeSettings(frames=2)
    with pytest.raises(quantize.Int8Disagrees, match="u8s8 recall 0.900; u8s8, 7-bit weights recall 0.900; "
                                                      "u8u8 recall 0.900") as caught:
        int8_model(nudenet_model, calibration_video=vtest_avi, settings=settings, cache_dir=tmp_path)
    assert len(tried) == 3 and len(caught.value.agreements) == 3
    assert not list(tmp_path.glob("*.onnx"))  # nothing kept
    # Remembered: the next call says the same at once, without building again.
    with pytest.raises(quantize.Int8Disagrees, match="finds FP32's boxes on this CPU"):
        int8_model(nudenet_model, calibration_video=vtest_avi, settings=settings, cache_dir=tmp_path)
    assert len(tried) == 3
    assert quantize.report(nudenet_model, vtest_avi, settings, tmp_path)["rejected"] is True


def test_int8_is_cpu_only_and_precision_is_checked(nudenet_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="int8 runs on onnx-cpu only"):
        create_detector(nudenet_model, "tensorrt", precision="int8")
    with pytest.raises(ValueError, match="unknown detector precision 'int4'"):
        create_detector(nudenet_model, "onnx-cpu", precision="int4")
    with pytest.raises(ModelNotFound, match="no such calibration video"):
        create_detector(nudenet_model, "onnx-cpu", precision="int8", calibration=tmp_path / "none.mp4")
    with pytest.raises(ValueError, match="calibration must be"):
        QuantizeSettings(calibration="kl")  # type: ignore[arg-type]


def test_the_head_policy_names_the_decode_nodes(nudenet_model: Path) -> None:
    model = onnx.load(str(nudenet_model), load_external_data=False)
    decode = head_nodes(model, "keep-decode")
    outputs = head_nodes(model, "keep-outputs")
    assert "/model.22/dfl/Softmax" in decode and "/model.22/Concat_25" in decode
    assert not any("/cv" in name for name in decode)
    assert set(outputs) - set(decode) == {f"/model.22/cv{b}.{i}/cv{b}.{i}.2/Conv" for b in (2, 3) for i in range(3)}
    assert head_nodes(model, "quantize") == []


def test_the_config_takes_int8_for_the_cpu_only_and_names_the_key() -> None:
    from pydantic import ValidationError

    from realtime.config import DetectorSettings, validation_problems

    assert DetectorSettings(precision="int8").precision == "int8"
    assert DetectorSettings().precision == "auto"  # int8 for the bundled model on the CPU
    assert DetectorSettings(engine="tensorrt").precision == "auto"  # ... which means fp32 there
    with pytest.raises(ValidationError) as caught:
        DetectorSettings(engine="tensorrt", precision="int8")
    (problem,) = validation_problems(caught.value)
    assert problem["field"] == "precision" and "CPU only" in problem["message"]
    with pytest.raises(ValidationError):
        DetectorSettings(precision="int4")


def test_a_half_precision_graph_is_made_float32_before_quantizing() -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.full((2, 3, 1, 1), 0.5, np.float16), "w")
    scale = helper.make_tensor("s", TensorProto.FLOAT16, [], [2.0])
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16),
            helper.make_node("Conv", ["xh", "w"], ["c"]),
            helper.make_node("Constant", [], ["k"], value=scale),
            helper.make_node("Mul", ["c", "k"], ["y"]),
        ],
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 2, 4, 4])],
        [weight],
    )
    model = quantize.to_float32(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert not quantize.has_float16(model)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": np.ones((1, 3, 4, 4), np.float32)})
    assert out.dtype == np.float32 and np.allclose(out, 3.0)  # 3 channels x 0.5, times 2


def test_onnx_runtime_fuses_the_pairs_into_integer_kernels(int8_path: Path, tmp_path: Path) -> None:
    """Unfused Q/DQ pairs run float kernels between (de)quantizations: slower than FP32."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(int8_path), options, providers=["CPUExecutionProvider"])
    ops = [node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node]
    assert ops.count("QLinearConv") >= 60 and "Conv" in ops  # all but the DFL's conv (kept float)


def test_auto_precision_is_int8_for_the_bundled_model_on_the_cpu_only(nudenet_model: Path) -> None:
    from engines.models import default_detector_model
    from engines.registry import auto_precision

    assert auto_precision(default_detector_model(), "onnx-cpu") == "int8"
    assert auto_precision(default_detector_model(), "auto") == "int8"  # no GPU engine here
    assert auto_precision(default_detector_model(), "onnx-cuda") == "fp32"
    assert auto_precision(nudenet_model, "onnx-cpu") == "fp32"  # not measured: its owner decides


def test_auto_precision_is_a_precision_that_holds_on_this_cpu() -> None:
    # deploy/setup.sh built (and checked) the people model's INT8 copy on this machine; auto takes
    # it only where the check held, and says FP32 otherwise.
    from engines.models import default_detector_model
    from engines.onnx_backend import OnnxRuntimeBackend

    detector = create_detector(default_detector_model(), "onnx-cpu", precision="auto", threads=1)
    try:
        runtime = detector._runtime  # type: ignore[attr-defined]
        assert isinstance(runtime, OnnxRuntimeBackend)
        built = quantize.report(default_detector_model())
        assert built is not None  # built, or refused, on this machine: never taken from another
        if built.get("rejected"):
            assert runtime.model_path == str(default_detector_model())
        else:
            kept = built["agreements"][-1]
            assert kept["recall"] >= int8_agreement.MIN_RECALL and kept["drift"] <= int8_agreement.MAX_DRIFT
            assert "-int8-" in runtime.model_path and built["cpu"] == list(int8_agreement.cpu_int8_features())
    finally:
        detector.close()


def test_auto_precision_runs_fp32_when_the_int8_copy_cannot_be_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from engines import registry
    from engines.models import default_detector_model
    from engines.registry import create_detector

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    monkeypatch.setattr(quantize, "DEFAULT_CACHE_DIR", blocked / "vidsentry" / "int8")  # cannot be made
    monkeypatch.setattr(registry, "available_memory", lambda: 64 * 1024**3)  # memory is not what stops it
    with caplog.at_level("WARNING"):
        detector = create_detector(default_detector_model(), "onnx-cpu", precision="auto", threads=1)
    try:
        assert "running it in FP32" in caplog.text and "XDG_CACHE_HOME" in caplog.text  # and what to do
        image = np.zeros((64, 64, 3), np.uint8)
        assert len(detector.detect([image])) == 1
    finally:
        detector.close()


def test_auto_precision_does_not_build_the_int8_copy_without_the_memory_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from engines import registry
    from engines.models import default_detector_model

    monkeypatch.setattr(quantize, "DEFAULT_CACHE_DIR", tmp_path / "int8")  # nothing cached there
    monkeypatch.setattr(registry, "available_memory", lambda: 1 * 1024**3)
    with caplog.at_level("WARNING"):
        assert not registry._int8_buildable(default_detector_model(), None)
    assert "running it in FP32" in caplog.text and "1 GB available" in caplog.text
    assert not list((tmp_path).glob("**/*.onnx"))  # nothing was built
    monkeypatch.setattr(registry, "available_memory", lambda: 4 * 1024**3)  # a small laptop
    assert registry._int8_buildable(default_detector_model(), None)
