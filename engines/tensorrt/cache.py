"""The engine cache: one serialized engine per (ONNX bytes, TensorRT version, GPU, build settings).

An engine only runs on the GPU model and TensorRT version that built it, with the precision and
shapes it was built for, so all of these make up its key. The file name carries a digest of the
key and a JSON sidecar carries the key itself: a lookup is a file check, and when a model's
engine has to be rebuilt the log says which part of the key changed. Replaced engines of the
same ONNX file are deleted, so the cache holds one engine per model and settings in use.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vidsentry" / "trt"
Precision = Literal["fp32", "fp16", "int8"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8")


@dataclass(frozen=True, slots=True)
class EngineKey:
    onnx_sha256: str
    trt_version: str
    gpu_name: str
    compute_capability: tuple[int, int]
    precision: str
    profile: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # min, opt, max input shapes
    calibration_sha256: str = ""  # INT8 only: the calibration cache the scales came from

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["compute_capability"] = list(self.compute_capability)
        data["profile"] = [list(shape) for shape in self.profile]
        return data

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    def changes_from(self, old: dict[str, Any]) -> list[str]:
        """`field old -> new` for every key field that differs from a sidecar's."""
        new = self.to_json()
        return [f"{name} {old.get(name)!r} -> {value!r}" for name, value in new.items() if old.get(name) != value]


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class CacheEntry:
    onnx_path: Path
    engine_path: Path
    key: EngineKey

    @property
    def sidecar(self) -> Path:
        return self.engine_path.with_suffix(".json")


def cache_entry(cache_dir: str | Path, onnx_path: str | Path, key: EngineKey) -> CacheEntry:
    onnx = Path(onnx_path)
    return CacheEntry(onnx, Path(cache_dir) / f"{onnx.stem}-{key.digest()[:20]}.engine", key)


CacheState = Literal["fresh", "missing", "stale"]


def cache_state(entry: CacheEntry) -> tuple[CacheState, str]:
    """Whether the cached engine can be loaded as is, and if not, why (for the progress line)."""
    if entry.engine_path.is_file() and entry.engine_path.stat().st_size > 0:
        try:
            recorded = json.loads(entry.sidecar.read_text())
        except (OSError, ValueError):
            return "stale", "its key file is missing or unreadable"
        changed = entry.key.changes_from(recorded.get("key", {}))
        if changed:
            return "stale", "key differs: " + "; ".join(changed)
        return "fresh", f"cached engine {entry.engine_path}"
    previous = _previous_keys(entry)
    if previous:
        changes = min((entry.key.changes_from(old) for old in previous), key=len)
        return "stale", "the cached engine was built for other settings: " + "; ".join(changes)
    return "missing", "no engine cached for this model and settings yet"


def _previous_keys(entry: CacheEntry) -> list[dict[str, Any]]:
    """Keys of other engines cached for the same ONNX file."""
    return [key for _, key in _other_sidecars(entry)]


def _other_sidecars(entry: CacheEntry) -> list[tuple[Path, dict[str, Any]]]:
    """(sidecar path, key) of the other engines cached for the same ONNX file; unreadable ones skipped."""
    found = []
    for sidecar in entry.engine_path.parent.glob(f"{entry.onnx_path.stem}-*.json"):
        if sidecar == entry.sidecar:
            continue
        try:
            recorded = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            continue
        if recorded.get("onnx") == str(entry.onnx_path.resolve()) and isinstance(recorded.get("key"), dict):
            found.append((sidecar, recorded["key"]))
    return found


def store_engine(entry: CacheEntry, serialized: bytes | memoryview) -> None:
    """Write the engine and its key atomically, then drop engines this one replaces."""
    entry.engine_path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(entry.engine_path, bytes(serialized))
    sidecar = {"onnx": str(entry.onnx_path.resolve()), "key": entry.key.to_json(), "built_at": time.time()}
    _atomic_write(entry.sidecar, json.dumps(sidecar, indent=1).encode())
    for old, key in _other_sidecars(entry):
        # Engines of other GPUs stay: a shared cache directory may serve several kinds of host.
        if key.get("gpu_name") == entry.key.gpu_name:
            old.with_suffix(".engine").unlink(missing_ok=True)
            old.unlink(missing_ok=True)
            log.info("removed replaced TensorRT engine %s", old.with_suffix(".engine"))


def _atomic_write(path: Path, data: bytes) -> None:
    # Write-then-rename: a crash or a parallel worker never leaves a half-written engine.
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, path)


class BuildProgress:
    """Prints a line when an engine build starts, every `every_s` while it runs, and when it ends.

    TensorRT builds take minutes with no output at WARNING level; a user watching `vidsentry run`
    should see that something is happening and why."""

    def __init__(self, what: str, why: str, *, every_s: float = 15.0, out: TextIO | None = None) -> None:
        self._what, self._why, self._every = what, why, every_s
        self._out = out if out is not None else sys.stderr
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def __enter__(self) -> BuildProgress:
        self._started = time.monotonic()
        self._line(f"building TensorRT engine for {self._what} ({self._why}); one-off, can take minutes")
        self._thread = threading.Thread(target=self._tick, name="trt-build-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        outcome = "failed" if exc_type is not None else "done"
        self._line(f"TensorRT engine build for {self._what} {outcome} after {time.monotonic() - self._started:.0f} s")

    def _tick(self) -> None:
        while not self._done.wait(self._every):
            self._line(f"still building TensorRT engine for {self._what}: {time.monotonic() - self._started:.0f} s")

    def _line(self, text: str) -> None:
        print(f"vidsentry: {text}", file=self._out, flush=True)
