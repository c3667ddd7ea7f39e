"""`vidsentry serve` as a user runs it: a subprocess, its printed URL, SIGTERM to stop it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
_URL_LINE = re.compile(r"vidsentry: serving on (http://\S+)")


class ServeProcess:
    """Starts `python -m realtime.cli serve ARGS` with JSON logs going to a file."""

    def __init__(self, *args: str, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log_dir / "serve.log"
        # Settings from the caller's environment (a token, overrides) must not leak into the test.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("VIDSENTRY_")}
        self.env = {**inherited, "PYTHONUNBUFFERED": "1", "VIDSENTRY_LOG_JSON": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url: str | None = None

    def start(self, *, wait_for_url: bool = True, within_s: float = 60) -> ServeProcess:
        if self.proc is not None:
            raise RuntimeError("this ServeProcess was already started")
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "realtime.cli", "serve", *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        if wait_for_url:
            self.url = self._wait_for_url(within_s)
        return self

    def _wait_for_url(self, within_s: float) -> str:
        assert self.proc is not None
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            found = _URL_LINE.search(self.stderr())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}:\n{self.stderr()}")
            time.sleep(0.05)
        raise AssertionError(f"serve printed no URL within {within_s} s:\n{self.stderr()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code (SIGKILL if it does not exit in time)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"serve ignored SIGTERM for {timeout} s:\n{self.stderr()}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.stderr().splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue  # a traceback or a partial line
        return records

    def __enter__(self) -> ServeProcess:
        """`with ServeProcess(...).start():` or `with ServeProcess(...):`; the process never outlives the block."""
        return self if self.proc is not None else self.start()

    def __exit__(self, *_: object) -> None:
        self.kill()


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def http(
    method: str, url: str, body: Any = None, *, token: str | None = None, timeout: float = 10
) -> tuple[int, Any]:
    """(status, JSON body or text) of one request to a serve process; errors are answers too."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text
