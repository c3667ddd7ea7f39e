"""Files that appear whole or not at all."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def part_path(path: Path) -> Path:
    """Where `path` is written until complete: hidden, and ending in `.part` so a scan can drop it."""
    return path.with_name(f".{path.name}.part")


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yields a temporary path to write; renamed to `path` when the block ends, removed if it raises."""
    tmp = part_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
