"""What every command shares: its error type and exit codes, loading the detector, opening the bus.

Imported only once a command has been chosen, never to build `--help`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Collection
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engines.errors import EngineUnavailable
from engines.models import ModelNotFound, default_detector_model
from engines.registry import create_detector
from pipelines.capabilities import CAPABILITIES, critical_share, open_capabilities, shares_cpu
from pipelines.capability import Capability, CapabilityError, Flag, OpenContext
from pipelines.compute import ComputeBudget
from pipelines.detect import DETECTOR, detector_claim
from realtime.bus.embedded import EmbeddedNatsServer, MqttListener, NatsServerError
from realtime.bus.jetstream import StreamConflictError, StreamSetupError
from realtime.bus.outbox import Outbox
from realtime.bus.publisher import BusUnavailable, NatsEventPublisher
from realtime.cli.errors import EXIT_RUNTIME, EXIT_USAGE, CommandError
from realtime.config import Config, DetectorSettings, NatsSettings, validation_problems

log = logging.getLogger(__name__)


async def load_configured_detector(
    settings: DetectorSettings,
    *,
    model: str | None = None,
    engine: str | None = None,
    conf: float | None = None,
    precision: str | None = None,
    cores: int | None = None,
) -> Any:
    """The detector the settings describe (arguments win); a bad model or engine is a CommandError.
    `cores` (compute.cores) sizes its CPU threads when detector.threads does not."""
    try:
        path = Path(model) if model else settings.model or default_detector_model()
        return await asyncio.to_thread(
            create_detector,
            path,
            engine or settings.engine,
            conf=conf or settings.conf,
            iou=settings.iou,
            threads=settings.threads or cores,
            workers=settings.workers,
            precision=precision or settings.precision,
            calibration=settings.calibration,
        )
    except (ValueError, ModelNotFound, EngineUnavailable) as exc:  # ModelLoadError is a ValueError
        raise CommandError(str(exc)) from exc


def compute_budget(config: Config, detector: Any, *, off: Collection[str] = ()) -> ComputeBudget | None:
    """One budget for the cores when the detector shares them with another model (the recognizer,
    the segmenter; see pipelines.compute), with the detector's claim; the others add theirs as they
    open. None when the scheduler is off or nothing shares the detector's CPU. `off` names the
    capabilities the command turned off (`run --no-audio`: captions)."""
    settings = config.compute
    if not settings.scheduler or not str(detector.backend).endswith("-cpu"):
        return None
    if not shares_cpu(partial(getattr, config), off=off):
        return None
    cores = settings.cores or os.cpu_count() or 1
    share = critical_share(partial(getattr, config), off=off) or settings.captions_max_share
    budget = ComputeBudget(cores, critical_max_share=share, reserve_hold_s=settings.captions_reserve_s)
    budget.add(DETECTOR, detector_claim(detector, cores))
    log.info(
        "compute budget on",
        extra={"cores": cores, "captions_max_share": share},
    )
    return budget


@contextlib.asynccontextmanager
async def open_engines(
    config: Config, compute: ComputeBudget | None, *, off: Collection[str] = ()
) -> AsyncIterator[dict[str, object]]:
    """Every capability's shared engine as configured, by capability name, for the duration; one
    that cannot open as configured is a CommandError saying which setting."""
    try:
        async with open_capabilities(partial(getattr, config), OpenContext(compute), off=off) as opened:
            yield opened
    except CapabilityError as exc:
        raise CommandError(str(exc)) from exc


def with_capability_flags(config: Config, args: argparse.Namespace) -> Config:
    """The config with each capability flag given on the command line in its section (a flag wins
    over the section; `--vlm-url URL` is `vlm.endpoints: [URL]`)."""
    for capability in CAPABILITIES:
        for flag in capability.flags:
            given = getattr(args, flag.dest, None)
            if given:
                settings = with_flag(capability, flag, config.section(capability.section), given)
                config = config.model_copy(update={capability.section: settings})
    return config


def with_flag(capability: Capability[Any, Any], flag: Flag, settings: Any, given: str) -> Any:
    """The section with the flag's value in its key, checked as the section checks it."""
    try:
        return capability.settings.model_validate({**settings.model_dump(), flag.key: flag.value(given)})
    except ValidationError as exc:
        messages = "; ".join(p["message"] for p in validation_problems(exc))
        raise CommandError(f"{flag.name}: {messages}", EXIT_USAGE) from None


def open_outbox(settings: NatsSettings) -> Outbox | None:
    """The disk outbox the settings ask for (None without `outbox_dir`); the publisher owns it."""
    if settings.outbox_dir is None:
        return None
    try:
        return Outbox(settings.outbox_dir, max_events=settings.outbox_max_events, max_bytes=settings.outbox_max_bytes)
    except OSError as exc:  # OutboxError is one too (e.g. another process has the directory locked)
        raise CommandError(f"nats.outbox_dir {settings.outbox_dir}: {exc}", EXIT_RUNTIME) from exc


def mqtt_listener(settings: NatsSettings) -> MqttListener | None:
    """The embedded server's MQTT listener as `nats.mqtt_*` ask for it (None: no MQTT)."""
    if settings.mqtt_port is None:
        return None
    password = settings.mqtt_password.get_secret_value() if settings.mqtt_password is not None else None
    return MqttListener(settings.mqtt_port, settings.mqtt_host, settings.mqtt_username, password)


@contextlib.asynccontextmanager
async def open_bus(nats_url: str | None, settings: NatsSettings, node: str) -> AsyncIterator[NatsEventPublisher]:
    """Connect to the given NATS, or start an embedded server for the duration; with the
    configured disk outbox in front of it."""
    embedded: EmbeddedNatsServer | None = None
    store: tempfile.TemporaryDirectory[str] | None = None
    if nats_url is None:
        store = tempfile.TemporaryDirectory(prefix="vidsentry-nats-")
        embedded = EmbeddedNatsServer(store_dir=Path(store.name), mqtt=mqtt_listener(settings))
        try:
            await asyncio.to_thread(embedded.start)
        except NatsServerError as exc:  # e.g. nats.mqtt_port taken: one line, not a traceback
            store.cleanup()
            raise CommandError(str(exc).splitlines()[0], EXIT_RUNTIME) from exc
        nats_url = embedded.url
        print(f"vidsentry: embedded NATS at {nats_url} (vidsentry subscribe --nats-url {nats_url})",
              file=sys.stderr)
        if embedded.mqtt_url is not None:
            print(f"vidsentry: MQTT at {embedded.mqtt_url} (topics vidsentry/<stream>/<kind>)", file=sys.stderr)
    try:
        outbox = open_outbox(settings)
        try:
            publisher = NatsEventPublisher(
                nats_url,
                node=node,
                connect_timeout=settings.connect_timeout_s,
                stream_max_age_s=settings.stream_max_age_s,
                stream_replicas=settings.replicas,
                outbox=outbox,
            )
        except BaseException:
            if outbox is not None:
                outbox.close()
            raise
        try:
            try:
                await publisher.connect()
            except BusUnavailable as exc:
                raise CommandError(str(exc), EXIT_RUNTIME) from exc
            except StreamConflictError as exc:  # the operator's streams disagree with ours: a setting to fix
                raise CommandError(str(exc), EXIT_USAGE) from exc
            except StreamSetupError as exc:
                raise CommandError(str(exc), EXIT_RUNTIME) from exc
            yield publisher
        finally:
            with contextlib.suppress(Exception):
                await publisher.close()  # closes the outbox too
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        if store is not None:
            store.cleanup()
