"""`engines` is the bottom layer: it must never import `pipelines` or `realtime`."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINES = Path(__file__).resolve().parents[2] / "engines"


def test_engines_import_nothing_above_them() -> None:
    offenders = []
    for path in sorted(ENGINES.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            offenders += [f"{path.name}: {m}" for m in modules if m.split(".")[0] in {"pipelines", "realtime"}]
    assert not offenders
