"""Drive the test RTSP server (tests/support/rtsp_server.py) as a subprocess.

`RtspServer` starts it, waits for "READY", and can SIGKILL, SIGSTOP (a frozen camera:
the TCP connection stays open and nothing arrives), SIGCONT and restart it on the same
port. `rtsp_server` is the pytest fixture; it always kills the process at teardown.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

SERVER_SCRIPT = Path(__file__).with_name("rtsp_server.py")
READY_TIMEOUT_S = 30.0


class RtspServer:
    def __init__(
        self,
        *,
        clip: Path | None = None,
        port: int = 0,
        log_path: Path | None = None,
        resize_every_s: float | None = None,
    ) -> None:
        self.clip = clip
        self.resize_every_s = resize_every_s  # /resize's switch period (None: the server's default)
        self.port = port  # 0 until the first start picks a free port
        self.log_path = log_path
        self._proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None
        self.paused = False

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> RtspServer:
        if self.running:
            raise RuntimeError("RTSP server already running")
        command = [sys.executable, str(SERVER_SCRIPT), "--port", str(self.port)]
        if self.clip is not None:
            command += ["--clip", str(self.clip)]
        if self.resize_every_s is not None:
            command += ["--resize-every", str(self.resize_every_s)]
        if self.log_path is not None and self._log is None:
            self._log = self.log_path.open("a")
        self._proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=self._log if self._log is not None else subprocess.DEVNULL,
            text=True,
        )
        self.paused = False
        self.port = self._wait_ready(self._proc)
        return self

    def _wait_ready(self, proc: subprocess.Popen[str]) -> int:
        assert proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.2)
            if ready:
                line = proc.stdout.readline()
                if line.startswith("READY"):
                    return int(line.split()[1])
                if not line and proc.poll() is not None:
                    break
            elif proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(f"RTSP server did not become ready (see {self.log_path or 'stderr'})")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def kill(self) -> None:
        """SIGKILL: a camera that vanishes (connections reset, port closed)."""
        proc, self._proc = self._proc, None
        self.paused = False
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()

    def pause(self) -> None:
        """SIGSTOP: a frozen camera (sockets stay open, nothing arrives)."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def restart(self) -> RtspServer:
        """Kill (if running) and start again on the same port."""
        self.kill()
        return self.start()

    def close(self) -> None:
        self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _signal(self, signum: int) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("RTSP server is not running")
        os.kill(self._proc.pid, signum)

    # -- addresses ------------------------------------------------------------------------

    def url(self, mount: str = "/test", *, userinfo: str = "") -> str:
        at = f"{userinfo}@" if userinfo else ""
        return f"rtsp://{at}127.0.0.1:{self.port}/{mount.lstrip('/')}"

    def __enter__(self) -> RtspServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


def running_rtsp(log_dir: Path, clip: Path | None = None) -> Iterator[RtspServer]:
    """A started server for a fixture to yield from: /test (endless live), plus /vtest (`clip`,
    once) when given; closed afterwards whatever happened."""
    server = RtspServer(clip=clip, log_path=log_dir / "rtsp_server.log")
    try:
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.close()


@pytest.fixture
def rtsp_server(sample_clip: Path, tmp_path: Path) -> Iterator[RtspServer]:
    """A started server: /test (endless live) and /vtest (the sample clip, once)."""
    yield from running_rtsp(tmp_path, sample_clip)
