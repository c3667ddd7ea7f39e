"""`vidsentry doctor --parity` as a user runs it: the no-GPU answer here, and the comparison itself
run for real with ONNX Runtime CPU on both sides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.cuda_probe import cuda_device_count
from engines.registry import doctor
from realtime.cli.args import build_parser
from realtime.cli.doctor import doctor_command
from realtime.cli.errors import CommandError
from tests.support.cli import one_error_line, vidsentry

GPU_ENGINES = {"tensorrt", "onnxruntime-cuda"}


def doctor_in_process(*argv: str) -> int:
    """The command without a process start (2-3 s each): for answers that run no model."""
    return doctor_command(build_parser().parse_args(["doctor", *argv]))


def no_gpu_engine() -> bool:
    return not any(check.available for check in doctor() if check.name in GPU_ENGINES)


@pytest.mark.skipif(not no_gpu_engine(), reason="this host has a GPU engine")
def test_without_a_gpu_it_says_so_and_what_to_install(
    sample_clip: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = vidsentry("doctor", "--parity", "--frames", "2")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    out = proc.stdout
    assert out.startswith("parity: no GPU engine can run on this machine")
    assert "\n  tensorrt: " in out and "\n  onnxruntime-cuda: " in out
    assert "pip install 'tensorrt>=10' pycuda" in out and "pip install onnxruntime-gpu" in out
    assert "--backend onnx-cpu" in out
    assert "Traceback" not in proc.stderr

    assert doctor_in_process("--parity", "--json") == 1
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["agree"] is None and set(report["engines"]) == GPU_ENGINES

    with pytest.raises(CommandError, match="tensorrt.*pip install") as caught:
        doctor_in_process("--parity", "--backend", "tensorrt")
    assert caught.value.code == 2


def test_same_model_on_both_sides_agrees_exactly(sample_clip: Path, nudenet_model: Path) -> None:
    proc = vidsentry("doctor", "--parity", "--backend", "onnx-cpu", "--model", str(nudenet_model),
                     "--frames", "3", "--conf", "0.05", "--json")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["frames"] == 3 and report["matched"] > 0
    assert report["only_reference"] == report["only_candidate"] == 0
    assert report["score_diff_max"] == 0.0 and report["iou_min"] == 1.0
    assert report["agree"] is True and report["verdict"].startswith("AGREE")
    assert report["reference_ms_per_frame"] > 0 and report["candidate_ms_per_frame"] > 0
    assert report["file"] == str(sample_clip)


def test_text_report_and_a_disagreement(sample_clip: Path, nudenet_model: Path, fall_model: Path) -> None:
    # Two different models "disagree": the report still comes out whole, with exit 1.
    proc = vidsentry("doctor", "--parity", "--backend", "onnx-cpu", "--model", str(nudenet_model),
                     "--reference-model", str(fall_model), "--frames", "1", "--file", str(sample_clip))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stdout.splitlines()
    assert lines[0] == ("parity: onnxruntime-cpu, 320n.onnx against onnxruntime-cpu, best_fp16.onnx "
                        "on 1 frames of vtest_speech.mp4")
    assert lines[1].startswith("boxes: ") and "only in the reference" in lines[1]
    assert any(line.startswith("time per frame: candidate ") for line in lines)
    assert lines[-1].startswith("verdict: DISAGREE: ")


def test_bad_usage(sample_clip: Path, tmp_path: Path) -> None:
    assert "--json only apply with --parity" in one_error_line(vidsentry("doctor", "--json"), 2)
    for argv, message in [
        (["--file", str(tmp_path / "nope.mp4")], "nope.mp4: no such video file"),
        (["--frames", "0"], "--frames must be between 1"),
        (["--conf", "2"], "--conf must be in"),
        (["--backend", "onnx-cpu", "--model", str(tmp_path / "none.onnx")], "none.onnx: no such model file"),
    ]:
        with pytest.raises(CommandError, match=message) as caught:
            doctor_in_process("--parity", *argv)
        assert caught.value.code == 2


def test_plain_doctor_reports_nvdec(capsys: pytest.CaptureFixture[str]) -> None:
    doctor_in_process()
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nvdec-decode")]
    mark = row.split()[1]
    assert mark in ("yes", "no") and "NVDEC" in row
    if cuda_device_count()[0] == 0:
        assert mark == "no" and "no NVIDIA driver" in row or "without the CUDA hwdevice" in row
