"""The tests mirror the source tree: a test folder is named after the folder whose code it tests,
so the tests of `realtime/http/` are found in `tests/realtime/http/`. Shared helpers live in
`tests/support/`."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
NOT_MIRRORED = {"support", "__pycache__"}


def folders_of(root: Path = TESTS) -> list[Path]:
    return [p for p in sorted(root.rglob("*")) if p.is_dir() and not NOT_MIRRORED & set(p.relative_to(root).parts)]


def unmirrored(tests: Path, root: Path) -> list[str]:
    return [str(p.relative_to(tests)) for p in folders_of(tests) if not (root / p.relative_to(tests)).is_dir()]


def test_every_test_folder_names_a_source_folder() -> None:
    assert not unmirrored(TESTS, ROOT)


def test_the_check_sees_a_folder_without_source(tmp_path: Path) -> None:
    (tmp_path / "tests" / "realtime" / "nowhere").mkdir(parents=True)
    (tmp_path / "realtime").mkdir()
    assert unmirrored(tmp_path / "tests", tmp_path) == ["realtime/nowhere"]
