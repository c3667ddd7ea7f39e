"""`vidsentry doctor`: which engines can run on this machine, and why not; with a VLM endpoint
configured (`--vlm-url`, or `vlm.endpoints` in `--config` / the environment), whether it answers."""

from __future__ import annotations

import argparse
import os

from engines.registry import EngineCheck, doctor
from pipelines.describe.config import VlmConfig
from realtime.cli.errors import EXIT_USAGE, CommandError
from realtime.config import ConfigError, load_config

PARITY_ONLY = ("file", "backend", "model", "reference_model", "calibration_cache", "json")


def doctor_command(args: argparse.Namespace | None = None) -> int:
    if args is not None and getattr(args, "parity", False):
        from realtime.cli.parity import parity_command

        return parity_command(args)
    given = [name for name in PARITY_ONLY if getattr(args, name, None)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise CommandError(f"{flags} only apply with --parity", EXIT_USAGE)
    checks = doctor()
    vlm_checks = _vlm_checks(args)
    from realtime.sources.decode import nvdec_status  # PyAV: only now, --help stays instant

    rows = [*checks, EngineCheck("nvdec-decode", *nvdec_status()), _allocator_check(), *vlm_checks]
    width = max(len(c.name) for c in rows)
    for check in rows:
        mark = "yes" if check.available else "no "
        print(f"{check.name:<{width}}  {mark}  {check.detail}")
    # nvdec and jemalloc are informative: CPU decode and glibc's malloc work.
    engines_ok = any(c.available and c.name.startswith("onnxruntime") for c in checks)
    return 0 if engines_ok and all(c.available for c in vlm_checks) else 1


def _allocator_check() -> EngineCheck:
    """Whether `serve` and `run` get jemalloc (realtime.cli.allocator): doctor itself never switches."""
    from realtime.cli.allocator import ENV, find_jemalloc

    library = find_jemalloc()
    if os.environ.get(ENV, "").lower() == "system":
        return EngineCheck("jemalloc", False, f"{ENV}=system: serve and run keep the C library's malloc")
    if library is None:
        return EngineCheck("jemalloc", False, "libjemalloc.so.2 not found (apt install libjemalloc2): serve and run "
                                              "use the C library's malloc, whose memory grows under long load")
    return EngineCheck("jemalloc", True, f"serve and run preload {library} ({ENV}=system to keep glibc's)")


def _vlm_checks(args: argparse.Namespace | None) -> list[EngineCheck]:
    urls: list[str] = list(getattr(args, "vlm_url", None) or [])
    config_path = getattr(args, "config", None)
    vlm = VlmConfig()
    if config_path or any(name.startswith("VIDSENTRY_VLM__") for name in os.environ):
        try:
            vlm = load_config(config_path).section("vlm")
        except ConfigError as exc:
            raise CommandError(str(exc), EXIT_USAGE) from None
    endpoints = tuple(urls or vlm.endpoints)
    if not endpoints:
        return []
    from engines.vlm.probe import probe_endpoints  # aiohttp only when there is an endpoint to ask

    model = getattr(args, "vlm_model", None) or vlm.model
    api_key = os.environ.get(vlm.api_key_env) or None
    return probe_endpoints(endpoints, model, api_key=api_key, image_size=(vlm.frame_width, vlm.frame_height))
