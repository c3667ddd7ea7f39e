"""The docs point only inside the repository: a page a docstring or comment names, and every link
of a page, is a file here, so a reader never follows a pointer to notes that were never committed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_OURS = {".git", ".venv", ".cache", ".ruff_cache", ".pytest_cache", "__pycache__", "node_modules"}
TEXT = {".py", ".md", ".js", ".html", ".css", ".yaml", ".yml", ".sh", ".toml", ".conf"}
# A page named in text, as a path (`docs/events.md`, a sibling page, one up from here) or alone.
PAGE = re.compile(r"(?<![\w/.-])((?:\.\./|[\w-]+/)*[\w.-]+\.md)\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def text_files() -> Iterator[Path]:
    for path in sorted(ROOT.rglob("*")):
        ours = not NOT_OURS & set(path.relative_to(ROOT).parts)
        if ours and path.is_file() and (path.suffix in TEXT or path.name == "Dockerfile"):
            yield path


def inside(candidate: Path) -> bool:
    resolved = candidate.resolve()
    return resolved.is_file() and ROOT in resolved.parents


def test_every_page_named_in_the_code_and_docs_is_in_the_repository() -> None:
    missing = []
    for path in text_files():
        for match in PAGE.finditer(path.read_text(errors="replace")):
            name = match.group(1)
            # As written: beside the file, from the root, or a page of docs/ by its name.
            if not any(inside(base / name) for base in (path.parent, ROOT, ROOT / "docs")):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert missing == []


def test_every_link_of_a_page_leads_to_a_file_in_the_repository() -> None:
    broken = []
    for path in text_files():
        if path.suffix != ".md":
            continue
        prose = FENCE.sub("", path.read_text(errors="replace"))
        for match in LINK.finditer(prose):
            target = match.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...: not a file
                continue
            if not inside(path.parent / target):
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []
