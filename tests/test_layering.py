"""Imports point one way: `realtime` → `pipelines` → `engines`. `engines` never imports the other
two; `pipelines` never imports `realtime` (it gets sources and sinks through protocols).

Inside `realtime/` the folders stand on floors (FLOORS, lowest first). A module imports from its
own folder and from the floors below its own, never from above and never from another folder on
its own floor: folders on one floor know nothing of each other. Every import counts, one inside a
function or under TYPE_CHECKING too: a deferred import is still a dependency.

The floors are drawn from the code (what each folder imports) in docs/architecture.md, between
the PICTURE markers; a test fails when the picture there is not the one the code draws.
`python -m tests.test_layering` prints it; with `--write` it redraws it in the doc.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"engines": {"pipelines", "realtime"}, "pipelines": {"realtime"}}

# realtime/'s folders (and its top-level modules), lowest floor first. Why each stands where it does:
#   logs, bus, sources  import nothing of realtime/: logging, NATS, media in
#   config              the model of the YAML file; builds the policies sources/ defines
#   leases, streams     lease primitives in JetStream KV; the desired set and each stream's runner
#   timeline, webrtc, fleet  the search index (its indexer role is a lease); browser sessions,
#                       each a stream; workers sharing the desired set through leases
#   http                every route: the API, SSE, search, clips, WebRTC signalling
#   service             the composition root: builds and wires everything below
#   cli                 the commands, each a composition of its own
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("logs", "bus", "sources"),
    ("config",),
    ("leases", "streams"),
    ("timeline", "webrtc", "fleet"),
    ("http",),
    ("service",),
    ("cli",),
)
# The config floor is four top-level modules: the model and how it is read, overridden, checked.
FOLDER_OF = {"config_yaml": "config", "config_env": "config", "config_checks": "config"}
DOC = ROOT / "docs" / "architecture.md"
PICTURE_START = "<!-- floors: drawn by `python -m tests.test_layering --write`; tests/test_layering.py checks it -->"
PICTURE_END = "<!-- end of floors -->"


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


# Inside realtime/.


def floor_of(folder: str) -> int | None:
    return next((n for n, floor in enumerate(FLOORS) if folder in floor), None)


def folder_of(module: str) -> str | None:
    """`realtime.http.api` → "http", `realtime.config_env` → "config"; None outside realtime/."""
    parts = module.split(".")
    if parts[0] != "realtime" or len(parts) < 2:
        return None
    return FOLDER_OF.get(parts[1], parts[1])


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def realtime_imports(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import of a realtime module in `path`, relative ones resolved and
    `from realtime import x` read as `realtime.x`."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*anchor, node.module] if node.module else anchor)
            whole = node.module is None or base == "realtime"  # the names are modules
            names = [f"{base}.{alias.name}" for alias in node.names] if whole else [base]
        else:
            continue
        yield from ((node.lineno, name) for name in names if name.split(".")[0] == "realtime")


def realtime_folders(root: Path) -> set[str]:
    """What stands on a floor: every package and top-level module of realtime/."""
    found = {folder_of(module_name(path, root)) for path in (root / "realtime").glob("*.py")}
    found |= {folder_of(f"realtime.{path.parent.name}") for path in (root / "realtime").glob("*/__init__.py")}
    return {folder for folder in found if folder is not None}


def folder_imports(root: Path) -> Iterator[tuple[Path, int, str, str, str]]:
    """(file, line, module imported, its folder, the importing file's folder) across folders."""
    for path in sorted((root / "realtime").rglob("*.py")):
        own = folder_of(module_name(path, root))
        for line, module in realtime_imports(path, root):
            folder = folder_of(module)
            if own is not None and folder is not None and folder != own:
                yield path, line, module, folder, own


def upward_imports(root: Path) -> list[str]:
    """Every import from a folder to one on its own floor or above, as `file:line: module`."""
    offenders = []
    for path, line, module, folder, own in folder_imports(root):
        imported, importer = floor_of(folder), floor_of(own)
        if imported is None or importer is None or imported >= importer:
            offenders.append(f"{path.relative_to(root)}:{line}: {module} ({own} → {folder})")
    return offenders


def test_every_folder_of_realtime_stands_on_one_floor() -> None:
    listed = [folder for floor in FLOORS for folder in floor]
    assert len(listed) == len(set(listed))
    assert realtime_folders(ROOT) == set(listed), "a new folder of realtime/ needs its floor in FLOORS"


def test_no_import_inside_realtime_runs_up_or_across() -> None:
    assert upward_imports(ROOT) == []


def test_the_floor_check_sees_imports_up_and_across_even_deferred(tmp_path: Path) -> None:
    files = {
        "realtime/__init__.py": "",
        "realtime/config.py": "",
        "realtime/config_env.py": "from realtime.config import Config\n",
        "realtime/streams/__init__.py": "",
        "realtime/streams/runner.py": "from realtime.config import Config\nfrom . import view\n",
        "realtime/streams/view.py": "def later():\n    from realtime.http import api\n",
        "realtime/timeline/__init__.py": "from .. import fleet\nfrom realtime.leases.keeper import LeaseKeeper\n",
        "realtime/http/__init__.py": "",
        "realtime/http/api.py": "from realtime import streams\nfrom ..service import service\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert upward_imports(tmp_path) == [
        "realtime/http/api.py:2: realtime.service (http → service)",
        "realtime/streams/view.py:2: realtime.http (streams → http)",
        "realtime/timeline/__init__.py:1: realtime.fleet (timeline → fleet)",
    ]


# The picture in docs/architecture.md.


def picture(root: Path = ROOT) -> str:
    """The floors, highest first, each folder with the folders it imports (highest first)."""
    imports: dict[str, set[str]] = {}
    for _, _, _, folder, own in folder_imports(root):
        imports.setdefault(own, set()).add(folder)
    width = max(len(folder) for floor in FLOORS for folder in floor)
    rule = "─" * (width + 2)
    rows = []
    for floor in reversed(FLOORS):
        rows.append(rule)
        for folder in floor:
            below = sorted(imports.get(folder, ()), key=lambda f: (-(floor_of(f) or 0), f))
            rows.append(f"{folder:<{width}}  → {', '.join(below)}" if below else f"{folder:<{width}}  (nothing)")
    return "\n".join(rows[1:])


def doc_picture(text: str) -> str:
    start, end = text.index(PICTURE_START), text.index(PICTURE_END)
    block = text[start + len(PICTURE_START) : end].strip()
    assert block.startswith("```") and block.endswith("```"), "the picture is one fenced block"
    return block.removeprefix("```").removesuffix("```").strip("\n")


def test_the_doc_draws_the_floors_the_code_has() -> None:
    assert doc_picture(DOC.read_text()) == picture(), "redraw it: python -m tests.test_layering --write"


def main(argv: list[str]) -> None:
    drawn = picture()
    if "--write" not in argv:
        print(drawn)
        return
    text = DOC.read_text()
    start, end = text.index(PICTURE_START) + len(PICTURE_START), text.index(PICTURE_END)
    DOC.write_text(f"{text[:start]}\n```\n{drawn}\n```\n{text[end:]}")


if __name__ == "__main__":
    main(sys.argv[1:])
