"""Real disk faults for outbox tests: a directory that stops taking changes, and a full disk.

`read_only(directory)` makes the directory refuse new, renamed and deleted names while files
already open keep taking writes (what `chattr +i` does to a directory). As root, which a mode
change does not stop, it bind-mounts the directory read-only over itself; otherwise it takes the
write bits away. `small_disk(directory, size)` mounts a tmpfs of that size there (root only), and
`fill(directory)` fills it up. Both undo themselves at the end of the block.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OSError(errno.EPERM, f"mount {' '.join(args)}: {proc.stderr.strip()}")


def _umount(directory: Path) -> None:
    # Lazily if something (a failed test's open outbox) still holds it: detached now, freed at close.
    if subprocess.run(["umount", str(directory)], capture_output=True, check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=True)


def can_mount() -> bool:
    return os.geteuid() == 0


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    if os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(mode)
        return
    try:
        _mount("--bind", str(directory), str(directory))
    except OSError as exc:
        pytest.skip(f"cannot make a directory read-only here: {exc}")
    try:
        _mount("-o", "remount,ro,bind", str(directory))
        yield
    finally:
        _umount(directory)


@contextlib.contextmanager
def small_disk(directory: Path, size_bytes: int) -> Iterator[Path]:
    if not can_mount():
        pytest.skip("a full disk needs a tmpfs mount, which needs root")
    directory.mkdir(parents=True, exist_ok=True)
    try:
        _mount("-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory))
    except OSError as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield directory
    finally:
        _umount(directory)


def fill(directory: Path) -> Path:
    """Fill the filesystem of `directory` to the last byte; delete the returned file to free it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return filler
