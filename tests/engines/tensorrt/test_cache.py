"""Engine cache keys, staleness and replacement (pure logic: no TensorRT needed)."""

from __future__ import annotations

import dataclasses
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from engines.tensorrt.cache import BuildProgress, EngineKey, cache_entry, cache_state, file_sha256, store_engine

BASE = EngineKey(
    onnx_sha256="a" * 64,
    trt_version="10.3.0",
    gpu_name="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0),
    precision="fp16",
    profile=((1, 3, 640, 640), (8, 3, 640, 640), (8, 3, 640, 640)),
)
CHANGES: dict[str, Any] = {
    "onnx_sha256": "b" * 64,
    "trt_version": "10.4.0",
    "gpu_name": "NVIDIA L4",
    "compute_capability": (8, 9),
    "precision": "int8",
    "profile": ((1, 3, 640, 640), (16, 3, 640, 640), (16, 3, 640, 640)),
    "calibration_sha256": "c" * 64,
}


def test_key_is_stable_for_equal_inputs() -> None:
    same = EngineKey(**{f.name: getattr(BASE, f.name) for f in dataclasses.fields(EngineKey)})
    assert same.digest() == BASE.digest()
    assert len({BASE.digest() for _ in range(3)}) == 1


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_key_changes_with_each_input(field: str) -> None:
    changed = dataclasses.replace(BASE, **{field: CHANGES[field]})
    assert changed.digest() != BASE.digest()
    assert [c.split(" ")[0] for c in changed.changes_from(BASE.to_json())] == [field]


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision"):
        dataclasses.replace(BASE, precision="int4")


def test_onnx_hash_is_of_the_bytes(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x" * (3 << 20))
    first = file_sha256(model)
    model.write_bytes(b"x" * (3 << 20) + b"y")
    assert file_sha256(model) != first


def test_missing_then_fresh_then_stale_and_replaced(tmp_path: Path) -> None:
    onnx = tmp_path / "yolo.onnx"
    onnx.write_bytes(b"onnx")
    cache = tmp_path / "cache"
    entry = cache_entry(cache, onnx, BASE)
    assert cache_state(entry)[0] == "missing"

    store_engine(entry, b"engine-1")
    state, why = cache_state(entry)
    assert state == "fresh" and str(entry.engine_path) in why
    assert json.loads(entry.sidecar.read_text())["key"] == BASE.to_json()

    upgraded = cache_entry(cache, onnx, dataclasses.replace(BASE, trt_version="10.5.0"))
    state, why = cache_state(upgraded)
    assert state == "stale" and "trt_version '10.3.0' -> '10.5.0'" in why

    store_engine(upgraded, b"engine-2")
    assert not entry.engine_path.exists() and not entry.sidecar.exists()  # replaced: deleted
    assert upgraded.engine_path.read_bytes() == b"engine-2"
    assert sorted(p.suffix for p in cache.iterdir()) == [".engine", ".json"]


def test_engines_of_other_gpus_are_kept(tmp_path: Path) -> None:
    onnx = tmp_path / "yolo.onnx"
    onnx.write_bytes(b"onnx")
    h100 = cache_entry(tmp_path, onnx, BASE)
    l4 = cache_entry(tmp_path, onnx, dataclasses.replace(BASE, gpu_name="NVIDIA L4", compute_capability=(8, 9)))
    store_engine(h100, b"h100")
    store_engine(l4, b"l4")
    assert cache_state(h100)[0] == "fresh" and cache_state(l4)[0] == "fresh"


def test_unreadable_key_file_makes_the_engine_stale(tmp_path: Path) -> None:
    onnx = tmp_path / "yolo.onnx"
    onnx.write_bytes(b"onnx")
    entry = cache_entry(tmp_path, onnx, BASE)
    store_engine(entry, b"engine")
    entry.sidecar.write_text("{not json")
    assert cache_state(entry) == ("stale", "its key file is missing or unreadable")


def test_build_progress_lines() -> None:
    out = io.StringIO()
    with BuildProgress("yolo.onnx", "no engine cached", every_s=0.01, out=out):
        # The "build" lasts until the ticking thread has spoken (10 s: a failure bound only).
        deadline = time.monotonic() + 10.0
        while "still building" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("vidsentry: building TensorRT engine for yolo.onnx (no engine cached)")
    assert any("still building" in line for line in lines[1:-1])
    assert lines[-1].startswith("vidsentry: TensorRT engine build for yolo.onnx done after")

    out = io.StringIO()
    with pytest.raises(RuntimeError), BuildProgress("yolo.onnx", "stale", every_s=10, out=out):
        raise RuntimeError("parser failed")
    assert "failed after" in out.getvalue().splitlines()[-1]
