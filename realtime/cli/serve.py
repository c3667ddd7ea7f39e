"""`vidsentry serve`: the HTTP API and the config's streams, until SIGTERM / SIGINT.

Order of start: config (bad keys: exit 2) → listen address and token (a non-loopback
address without a token: exit 2) → detector → NATS (embedded when none is configured) →
HTTP → streams. Order of stop: see realtime.service.service; then the publisher is flushed and
drained (within what is left of http.shutdown_timeout_s; at once when NATS is down and an outbox
keeps the events, which it logs), and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from pipelines.detect import DetectionBatcher
from realtime.cli import checks
from realtime.cli.args import TOKEN_ENV
from realtime.cli.bootstrap import (
    compute_budget,
    load_configured_detector,
    open_bus,
    open_engines,
    with_capability_flags,
)
from realtime.cli.errors import EXIT_OK, EXIT_RUNTIME, CommandError
from realtime.config import Config, ConfigError, load_config
from realtime.config_checks import config_class_problems, config_own_settings_problems, config_rule_problems
from realtime.fleet.worker import DuplicateNode, FleetUnavailable
from realtime.http import ListenError
from realtime.leases.options import fleet_options, with_flags
from realtime.service.memory import cap_malloc_arenas
from realtime.service.service import Service
from realtime.timeline.errors import TimelineIndexError
from realtime.timeline.timeline import open_timeline

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ListenPlan:
    host: str
    port: int
    token: str | None = field(repr=False)


def is_loopback(host: str) -> bool:
    if host.rstrip(".").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another name may resolve anywhere: treat it as exposed


def plan_listen(args: argparse.Namespace, config: Config, environ: Mapping[str, str]) -> ListenPlan:
    host = args.host if args.host is not None else config.http.host
    port = args.port if args.port is not None else config.http.port
    if not 0 <= port <= 65535:
        raise CommandError(f"--port must be between 0 and 65535, got {port}")
    configured = config.http.api_token.get_secret_value() if config.http.api_token else ""
    # Secrets mounted from files often end in a newline; it is never part of the token.
    token = environ.get(TOKEN_ENV, "").strip() or configured.strip() or None
    allowed = args.allow_unauthenticated or config.http.allow_unauthenticated
    if token is None and not is_loopback(host):
        if not allowed:
            raise CommandError(
                f"refusing to serve the API on {host} without a token: set {TOKEN_ENV} (or http.api_token), "
                "or pass --allow-unauthenticated if anyone who can reach it may control it"
            )
        log.warning("serving a non-loopback address without an API token", extra={"host": host})
    return ListenPlan(host, port, token)


def _print_listening(url: str, token: str | None) -> None:
    auth = "bearer token required on /api" if token else "no API token"
    print(f"vidsentry: serving on {url} ({auth})", file=sys.stderr, flush=True)


async def serve_command(args: argparse.Namespace) -> int:
    # Before any thread exists (the detector loads on one): only arenas created after this are capped.
    cap_malloc_arenas()
    checks.nats_url(args.nats_url)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    try:
        config = with_flags(config, fleet=args.fleet, node=args.node)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    plan = plan_listen(args, config, os.environ)
    config = with_capability_flags(config, args)
    problems = config_rule_problems(config)  # a rule no capability is on to answer never fires
    if problems:
        raise CommandError(f"{args.config or 'environment'}: {problems}")

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stop_requested_at: list[float] = []

    def on_signal(name: str) -> None:
        if stop.is_set():
            log.warning("already shutting down", extra={"signal": name})
            return
        log.info("shutting down", extra={"signal": name})
        stop_requested_at.append(loop.time())
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    try:
        detector = await load_configured_detector(config.detector, cores=config.compute.cores)
        try:
            # A rule on a class the model does not have could never fire: refuse it before anything starts.
            problems = config_class_problems(config, detector.info.names)
            if problems:
                raise CommandError(f"{args.config or 'environment'}: {problems}")
            log.info("detector loaded", extra={"model": detector.info.path, "backend": detector.backend})
            compute = compute_budget(config, detector)
            try:
                async with (
                    open_bus(args.nats_url or config.nats.url, config.nats, config.node) as publisher,
                    DetectionBatcher(detector, compute=compute) as batcher,
                    open_engines(config, compute) as opened,
                    open_timeline(config.timeline, lambda: publisher.nc, node=config.node,
                                  fleet=fleet_options(config)) as timeline,
                ):
                    # A stream's own model, language or translation the engines cannot serve: refused now.
                    problems = config_own_settings_problems(config, opened)
                    if problems:
                        raise CommandError(f"{args.config or 'environment'}: {problems}")
                    service = Service(
                        config, batcher, publisher, api_token=plan.token, opened=opened, timeline=timeline
                    )
                    try:
                        await service.run(
                            plan.host, plan.port, stop, on_listening=lambda url: _print_listening(url, plan.token)
                        )
                    except ListenError as exc:
                        raise CommandError(str(exc), EXIT_RUNTIME) from None
                    except DuplicateNode as exc:  # another live worker has this --node: exit 2, one line
                        raise CommandError(str(exc)) from None
                    except FleetUnavailable as exc:
                        raise CommandError(f"cannot join fleet {config.fleet.name!r}: {exc}", EXIT_RUNTIME) from None
                    # One budget for stopping streams and flushing, so the whole drain fits the grace period.
                    spent = loop.time() - stop_requested_at[0] if stop_requested_at else 0.0
                    nats_connected = publisher.connected
                    flushed = await publisher.close(max(2.0, config.http.shutdown_timeout_s - spent))
                    stats = publisher.stats
                    log.info(
                        "service stopped",
                        extra={
                            "flushed": flushed,
                            "events": {
                                kind: {
                                    "published": k.published, "acked": k.acked, "failed": k.failed,
                                    "dropped": k.dropped,
                                }
                                for kind, k in sorted(stats.kinds.items())
                            },
                        },
                    )
                    if stats.outbox_depth:
                        log.warning(
                            "durable events wait in the outbox for the next start",
                            extra={
                                "outbox_events": stats.outbox_depth,
                                "outbox_dir": str(config.nats.outbox_dir),
                                "nats_connected": nats_connected,
                            },
                        )
                    elif not flushed:
                        log.warning("some durable events were still unacknowledged at shutdown")
            except TimelineIndexError as exc:  # the index file is unusable: say which and how to fix it
                raise CommandError(f"timeline.path: {exc}", EXIT_RUNTIME) from None
        finally:
            detector.close()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return EXIT_OK
