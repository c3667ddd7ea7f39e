"""One way to start a task in the service: beside a block, through a `TaskOwner` (pipelines/tasks.py),
which names it, logs its failure, and cancels and awaits it when its owner stops; or inside a
TaskGroup. A bare `asyncio.create_task` or `ensure_future` in `realtime/` would be a task nobody
cancels at shutdown and whose failure nobody sees."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPAWNERS = {"create_task", "ensure_future"}


def bare_spawns(path: Path) -> list[int]:
    """Lines that start a task outside an owner: `asyncio.create_task(...)`, `asyncio.ensure_future(...)`,
    a loop's `create_task` (`loop.create_task`, `get_running_loop().create_task`), or either name
    imported from asyncio. A TaskGroup's `group.create_task` is fine."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "asyncio":
            lines += [node.lineno for alias in node.names if alias.name in SPAWNERS]
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr not in SPAWNERS:
            continue
        target = node.func.value
        if isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute | ast.Name):
            lines.append(node.lineno)  # get_running_loop().create_task, get_event_loop().create_task
        elif isinstance(target, ast.Name) and (target.id == "asyncio" or target.id.endswith("loop")):
            lines.append(node.lineno)
    return sorted(lines)


def test_realtime_starts_no_task_outside_an_owner() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "realtime").rglob("*.py"))
        for line in bare_spawns(path)
    ]
    assert not offenders, "spawn it on a TaskOwner (or in a TaskGroup)"


def test_the_check_sees_each_bare_form(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text(
        "import asyncio\n"
        "from asyncio import ensure_future\n"
        "asyncio.create_task(work())\n"
        "asyncio.ensure_future(work())\n"
        "asyncio.get_running_loop().create_task(work())\n"
        "loop.create_task(work())\n"
        "group.create_task(work())\n"
    )
    assert bare_spawns(module) == [2, 3, 4, 5, 6]
