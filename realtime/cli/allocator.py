"""`serve` and `run` run on jemalloc where it is installed, because glibc's malloc let serve's memory
grow under sustained load.

In the half-hour soak (8 cameras, 4 browser peers, every stage; docs/operations.md) serve's
resident memory kept climbing on glibc's malloc while the memory in use did not: glibc keeps freed
pages in its per-thread arenas, and a `malloc_trim` did not hold. The same run with jemalloc
preloaded stayed flat at a lower level. jemalloc can only be chosen before the process starts, so
`serve` and `run`, started as a program, execute themselves again once with `libjemalloc.so.2`
in `LD_PRELOAD` when it is found (`deploy/setup.sh` and the container image install it; Debian's
package is `libjemalloc2`). `VIDSENTRY_ALLOCATOR=system` keeps glibc's. Where none is found, or it
is preloaded already, nothing happens. `vidsentry doctor` says which one runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "VIDSENTRY_ALLOCATOR"
COMMANDS = frozenset({"serve", "run", "subscribe", "search", "ask", "doctor"})
LONG_RUNNING = frozenset({"serve", "run"})
_LIBRARY = "libjemalloc.so.2"
_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                 "/usr/local/lib")


def find_jemalloc() -> str | None:
    for directory in _LIBRARY_DIRS:
        candidate = Path(directory) / _LIBRARY
        if candidate.is_file():
            return str(candidate)
    return None


def running() -> str:
    """The allocator this process runs on: jemalloc when it is mapped, else the C library's."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return "jemalloc" if any("jemalloc" in line for line in maps) else "system"
    except OSError:
        return "system"


def _command(argv: list[str]) -> str | None:
    """The command named (the first word that is one: an option's value may come before it)."""
    return next((arg for arg in argv if arg in COMMANDS), None)


def reexec_on_jemalloc(argv: list[str]) -> None:
    """For `serve` and `run` on Linux: run again with jemalloc preloaded, unless told not to
    (`VIDSENTRY_ALLOCATOR=system`), it is not installed, or it is loaded already. Returns only when
    nothing is done."""
    if not sys.platform.startswith("linux") or os.environ.get(ENV, "").lower() == "system":
        return
    if _command(argv) not in LONG_RUNNING:
        return
    preload = os.environ.get("LD_PRELOAD", "")
    if "jemalloc" in preload or running() == "jemalloc":
        return  # also stops a second exec if the loader refused the library
    library = find_jemalloc()
    if library is None:
        return
    env = dict(os.environ, LD_PRELOAD=f"{library}:{preload}" if preload else library)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "realtime.cli", *argv], env)
