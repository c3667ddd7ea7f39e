"""The `vidsentry` command as a real process, the way a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def vidsentry(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # The caller's own VIDSENTRY_* settings must not change the outcome.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("VIDSENTRY_")}
    return subprocess.run(
        [sys.executable, "-m", "realtime.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**inherited, "PYTHONUNBUFFERED": "1", **(env or {})},
        check=False,
    )


def one_error_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The command failed with `code` and said why in exactly one `vidsentry: error:` line on stderr."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vidsentry: error: "), proc.stderr
    return lines[0]
