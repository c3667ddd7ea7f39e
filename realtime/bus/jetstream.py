"""The JetStream stream that keeps the durable event kinds.

An operator may have made the stream already, or another stream may take our subjects. Subjects
are compared as NATS wildcards (`*` one token, `>` one or more), not as strings: a VIDSENTRY
stream whose subjects cover ours (say `vidsentry.>`) is used as it is; another stream whose
subjects overlap ours is a conflict JetStream would refuse (a subject belongs to one stream), and
`StreamConflictError` names it and says what to do.
"""

from __future__ import annotations

import logging
from typing import Literal

from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, BadRequestError, NotFoundError

from pipelines.events import DURABLE_KINDS, EventKind
from realtime.errors import ServiceError

log = logging.getLogger(__name__)

STREAM_NAME = "VIDSENTRY"


def durable_subjects() -> tuple[str, ...]:
    """The durable kinds' subjects, as the kinds are declared now (a capability adds its own)."""
    return tuple(f"vidsentry.*.{kind.value}" for kind in EventKind if kind in DURABLE_KINDS)


DURABLE_SUBJECTS: tuple[str, ...] = durable_subjects()  # as built; the stream is set up with durable_subjects()
DUPLICATE_WINDOW_S = 120.0  # JetStream drops a re-sent Nats-Msg-Id within this window
_STREAM_NAME_IN_USE = 10058  # JetStream err_code: "stream name already in use with a different configuration"

StreamSetup = Literal["created", "updated", "unchanged"]
_MAX_LIST_PAGES = 100  # STREAM.LIST pages (256 streams each) read to find a conflict
MAX_REPLICAS = 5  # JetStream's own limit


class StreamSetupError(ServiceError, RuntimeError):
    """The stream cannot be created or brought to the settings we need."""


class StreamConflictError(StreamSetupError):
    """Another stream already takes subjects the VIDSENTRY stream needs (an operator must decide)."""


def subject_covers(pattern: str, subject: str) -> bool:
    """Whether every subject `subject` matches (it may hold wildcards itself) also matches `pattern`."""
    ours, theirs = pattern.split("."), subject.split(".")
    for i, token in enumerate(ours):
        if token == ">":
            return len(theirs) > i  # `>` takes one or more tokens, whatever they are
        if i >= len(theirs) or theirs[i] == ">":
            return False
        if token != "*" and token != theirs[i]:  # a literal covers only itself, not `*`
            return False
    return len(ours) == len(theirs)


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some subject matches both patterns."""
    left, right = a.split("."), b.split(".")
    for x, y in zip(left, right, strict=False):
        if x == ">" or y == ">":
            return True
        if x != y and "*" not in (x, y):
            return False
    return len(left) == len(right)


async def _refuse_conflicts(js: JetStreamContext, needed: list[str]) -> None:
    """StreamConflictError if a stream other than ours takes subjects overlapping `needed`."""
    offset = 0
    for _ in range(_MAX_LIST_PAGES):
        page = await js.streams_info(offset)
        if not page:
            return
        offset += len(page)
        for info in page:
            name = info.config.name
            if name == STREAM_NAME:
                continue
            taken = [s for s in info.config.subjects or [] if any(subjects_overlap(s, ours) for ours in needed)]
            if taken:
                raise StreamConflictError(
                    f"JetStream stream {name} already takes {', '.join(taken)}, which overlaps the subjects "
                    f"vidsentry keeps its durable events under ({', '.join(needed)}); remove those subjects "
                    f"from {name} (or delete it), or point vidsentry at another NATS server or account"
                )


def _reason(exc: APIError, replicas: int) -> str:
    if replicas == 1:
        return str(exc.description)
    # The server's words ("no suitable peers for placement", "replicas > 1 not supported in
    # non-clustered mode") do not name the setting that asked for them.
    return (
        f"{exc.description} (nats.replicas is {replicas}: that needs a cluster of {replicas} or more JetStream servers)"
    )


def check_max_age(max_age_s: float) -> float:
    """0 means keep forever; otherwise the age must cover the duplicate window (the server insists)."""
    if max_age_s < 0 or (0 < max_age_s < DUPLICATE_WINDOW_S):
        raise ValueError(f"stream max_age must be 0 (unlimited) or >= {DUPLICATE_WINDOW_S:g} s, got {max_age_s:g}")
    return float(max_age_s)


def check_replicas(replicas: int) -> int:
    """JetStream keeps 1 to 5 copies of a stream (more than the cluster has nodes is refused at create)."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"stream replicas must be 1 to {MAX_REPLICAS}, got {replicas}")
    return replicas


def desired_config(max_age_s: float, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=STREAM_NAME,
        description=f"vidsentry durable events ({', '.join(k.value for k in EventKind if k in DURABLE_KINDS)})",
        subjects=list(durable_subjects()),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=check_max_age(max_age_s),
        duplicate_window=DUPLICATE_WINDOW_S,
        num_replicas=check_replicas(replicas),
    )


async def ensure_stream(js: JetStreamContext, max_age_s: float, replicas: int = 1) -> StreamSetup:
    """Create VIDSENTRY if missing; otherwise add missing subjects, apply max_age and replicas and
    widen a too-short duplicate window. Other settings an operator chose are left alone."""
    try:
        info = await js.stream_info(STREAM_NAME)
    except NotFoundError:
        await _refuse_conflicts(js, list(durable_subjects()))
        try:
            await js.add_stream(desired_config(max_age_s, replicas))
            log.info("created JetStream stream %s max_age_s=%g replicas=%d", STREAM_NAME, max_age_s, replicas)
            return "created"
        except APIError as exc:
            if not (isinstance(exc, BadRequestError) and exc.err_code == _STREAM_NAME_IN_USE):
                raise StreamSetupError(
                    f"cannot create JetStream stream {STREAM_NAME}: {_reason(exc, replicas)}"
                ) from None
            # Another worker created it between our lookup and create: fall through and reconcile.
            info = await js.stream_info(STREAM_NAME)

    current = info.config
    changes: dict[str, object] = {}
    subjects = list(current.subjects or [])
    wanted = durable_subjects()
    missing = [s for s in wanted if not any(subject_covers(theirs, s) for theirs in subjects)]
    if missing:
        await _refuse_conflicts(js, missing)
        changes["subjects"] = subjects + missing
    elif not set(wanted) <= set(subjects):
        log.info(
            "JetStream stream %s takes %s, which covers the durable subjects; using its subjects as they are",
            STREAM_NAME,
            ", ".join(subjects),
        )
    if (current.max_age or 0.0) != max_age_s:
        changes["max_age"] = max_age_s
    if (current.num_replicas or 1) != replicas:
        # JetStream moves a stream between R1 and R3 in place (a cluster copies it to the new peers).
        changes["num_replicas"] = replicas
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
    except APIError as exc:
        raise StreamSetupError(f"cannot update JetStream stream {STREAM_NAME}: {_reason(exc, replicas)}") from None
    log.info("updated JetStream stream %s: %s", STREAM_NAME, ", ".join(sorted(changes)))
    return "updated"
