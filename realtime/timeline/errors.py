"""The timeline's errors, under one root: a caller may catch `TimelineError` for all of them."""

from __future__ import annotations

from realtime.errors import ServiceError


class TimelineError(ServiceError):
    """Anything the timeline refuses or cannot do now."""


class TimelineIndexError(TimelineError, RuntimeError):
    """The index file cannot be used (not SQLite, a newer schema, no FTS5)."""


class QueryTooBroad(TimelineError):
    """The query matched more than can be ranked within the time limit."""


class IndexUnavailable(TimelineError):
    """No worker answers for the fleet's index now (it is moving to another worker)."""


class RemoteRefusal(TimelineError):
    """The worker holding the fleet's index refused the request (the message says why)."""
