"""The JetStream stream that keeps the durable event kinds."""

from __future__ import annotations

import logging
from typing import Literal

from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import BadRequestError, NotFoundError

from pipelines.events import EventKind

log = logging.getLogger(__name__)

STREAM_NAME = "VIDSENTRY"
DURABLE_SUBJECTS: tuple[str, ...] = tuple(
    f"vidsentry.*.{kind.value}"
    for kind in (EventKind.TRACKS, EventKind.ALERTS, EventKind.CAPTIONS, EventKind.DESCRIPTIONS, EventKind.STATUS)
)
DUPLICATE_WINDOW_S = 120.0  # JetStream drops a re-sent Nats-Msg-Id within this window
_STREAM_NAME_IN_USE = 10058  # JetStream err_code: "stream name already in use with a different configuration"

StreamSetup = Literal["created", "updated", "unchanged"]


class StreamSetupError(RuntimeError):
    """The stream cannot be created or brought to the settings we need."""


def check_max_age(max_age_s: float) -> float:
    """0 means keep forever; otherwise the age must cover the duplicate window (the server insists)."""
    if max_age_s < 0 or (0 < max_age_s < DUPLICATE_WINDOW_S):
        raise ValueError(f"stream max_age must be 0 (unlimited) or >= {DUPLICATE_WINDOW_S:g} s, got {max_age_s:g}")
    return float(max_age_s)


def desired_config(max_age_s: float) -> StreamConfig:
    return StreamConfig(
        name=STREAM_NAME,
        description="vidsentry durable events (tracks, alerts, captions, descriptions, status)",
        subjects=list(DURABLE_SUBJECTS),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=check_max_age(max_age_s),
        duplicate_window=DUPLICATE_WINDOW_S,
    )


async def ensure_stream(js: JetStreamContext, max_age_s: float) -> StreamSetup:
    """Create VIDSENTRY if missing; otherwise add missing subjects, apply max_age and widen a
    too-short duplicate window. Other settings an operator chose are left alone."""
    try:
        info = await js.stream_info(STREAM_NAME)
    except NotFoundError:
        try:
            await js.add_stream(desired_config(max_age_s))
            log.info("created JetStream stream %s max_age_s=%g", STREAM_NAME, max_age_s)
            return "created"
        except BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:  # e.g. subjects overlap another stream
                raise StreamSetupError(f"cannot create JetStream stream {STREAM_NAME}: {exc.description}") from None
            # Another worker created it between our lookup and create: fall through and reconcile.
            info = await js.stream_info(STREAM_NAME)

    current = info.config
    changes: dict[str, object] = {}
    subjects = list(current.subjects or [])
    missing = [s for s in DURABLE_SUBJECTS if s not in subjects]
    if missing:
        changes["subjects"] = subjects + missing
    if (current.max_age or 0.0) != max_age_s:
        changes["max_age"] = max_age_s
    if (current.duplicate_window or 0.0) < DUPLICATE_WINDOW_S:
        changes["duplicate_window"] = DUPLICATE_WINDOW_S
    if current.storage != StorageType.FILE:
        log.warning(
            "JetStream stream %s uses %s storage; events will not survive a broker restart",
            STREAM_NAME,
            current.storage,
        )
    if not changes:
        return "unchanged"
    try:
        await js.update_stream(current.evolve(**changes))
    except BadRequestError as exc:
        raise StreamSetupError(f"cannot update JetStream stream {STREAM_NAME}: {exc.description}") from None
    log.info("updated JetStream stream %s: %s", STREAM_NAME, ", ".join(sorted(changes)))
    return "updated"
