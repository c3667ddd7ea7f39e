"""Imports point one way: `realtime` → `pipelines` → `engines`. `engines` never imports the other
two; `pipelines` never imports `realtime` (it gets sources and sinks through protocols)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"engines": {"pipelines", "realtime"}, "pipelines": {"realtime"}}


def imported_modules(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.append(node.module)
    return modules


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(package: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for module in imported_modules(path)
        if module.split(".")[0] in FORBIDDEN[package]
    ]
    assert not offenders


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("from realtime.config import Config\nimport realtime.http\n")
    assert imported_modules(module) == ["realtime.config", "realtime.http"]
