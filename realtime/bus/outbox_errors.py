"""The outbox's exceptions, in a module of their own because more than one outbox module raises
them (the segment files raise OutboxWriteError, the Outbox the rest); `realtime.bus.outbox`
re-exports them, and that is where callers import them from."""

from __future__ import annotations

from realtime.errors import ServiceError


class OutboxError(ServiceError, OSError):
    """Base class for outbox failures; an OSError, like the file errors it wraps."""


class OutboxLockedError(OutboxError):
    """Another Outbox (in this or another process) has the directory open."""


class OutboxWriteError(OutboxError):
    """The record could not be written (disk full, I/O error); the outbox is unchanged."""


class OutboxClosedError(OutboxError):
    """The outbox was used after close()."""
