"""`serve` and `run` execute themselves again with jemalloc preloaded, once, and only them: the
exec is caught here (a real one is checked on a running serve in test_serve_command.py)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from realtime.cli import allocator

LIBRARY = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


class Exec(Exception):
    def __init__(self, path: str, args: list[str], env: dict[str, str]) -> None:
        super().__init__(path)
        self.path, self.argv, self.env = path, args, env


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> None:
    def execve(path: str, args: list[str], env: dict[str, str]) -> Any:
        raise Exec(path, args, env)

    monkeypatch.setattr(allocator.os, "execve", execve)
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: LIBRARY)
    monkeypatch.setattr(allocator, "running", lambda: "system")
    monkeypatch.delenv(allocator.ENV, raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)


@pytest.mark.usefixtures("execs")
def test_serve_and_run_run_again_with_jemalloc_preloaded_before_what_was_there(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Exec) as serve:
        allocator.reexec_on_jemalloc(["--log-level", "info", "serve", "--port", "0"])
    assert serve.value.argv == [sys.executable, "-m", "realtime.cli", "--log-level", "info", "serve", "--port", "0"]
    assert serve.value.env["LD_PRELOAD"] == LIBRARY
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    with pytest.raises(Exec) as run:
        allocator.reexec_on_jemalloc(["run", "clip.mp4"])
    assert run.value.env["LD_PRELOAD"] == f"{LIBRARY}:/opt/other.so"


@pytest.mark.usefixtures("execs")
def test_nothing_happens_when_not_asked_not_needed_or_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (["doctor"], ["subscribe"], ["--help"], []):  # short commands keep the C library's
        allocator.reexec_on_jemalloc(argv)
    monkeypatch.setenv(allocator.ENV, "system")
    allocator.reexec_on_jemalloc(["serve"])
    monkeypatch.delenv(allocator.ENV)
    monkeypatch.setenv("LD_PRELOAD", LIBRARY)  # preloaded already (or refused by the loader: no loop)
    allocator.reexec_on_jemalloc(["serve"])
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setattr(allocator, "running", lambda: "jemalloc")
    allocator.reexec_on_jemalloc(["serve"])
    monkeypatch.setattr(allocator, "running", lambda: "system")
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: None)
    allocator.reexec_on_jemalloc(["serve"])


def test_this_process_says_which_allocator_it_runs_on() -> None:
    assert allocator.running() in ("jemalloc", "system")
