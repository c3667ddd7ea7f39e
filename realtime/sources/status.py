"""How a supervised stream reports its state: each change logged and handed to `on_status`.

Changes are reported once each, in order, on the event loop thread; the first has no previous
state. Reasons are redacted before they reach the event or the log; `detail`, when given, takes
the reason's place in the log only, so an untrusted stream's event can carry a generic reason
while the log keeps the real one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pipelines.frames import StatusChange, StreamState
from realtime.sources.spec import SourceSpec

log = logging.getLogger("realtime.sources.supervisor")  # one log name for the whole supervisor


class StatusReport:
    def __init__(
        self, stream_id: str, spec: SourceSpec, backend: str, on_status: Callable[[StatusChange], None]
    ) -> None:
        self.stream_id = stream_id
        self.spec = spec
        self.backend = backend
        self.state = StreamState.CONNECTING
        self._on_status = on_status
        self._reported = False  # no status emitted yet: the first one has previous=None

    def transition(
        self,
        state: StreamState,
        *,
        reason: str | None = None,
        detail: str | None = None,
        attempt: int = 0,
        retry_in: float | None = None,
    ) -> None:
        """Report a state change: `reason` goes into the status event, `detail` (if given) into the log."""
        previous = self.state if self._reported else None
        self.state = state
        self._reported = True
        reason = self.spec.redact(reason) if reason is not None else None
        logged = self.spec.redact(detail) if detail is not None else reason
        change = StatusChange(self.stream_id, state, previous, time.time(), reason, attempt, retry_in)
        level = logging.WARNING if state in (StreamState.STALLED, StreamState.FAILED) else logging.INFO
        log.log(
            level,
            "stream %s: %s",
            self.stream_id,
            state.value,
            extra={
                "stream_id": self.stream_id,
                "state": state.value,
                "previous": previous.value if previous is not None else None,
                "reason": logged,
                "attempt": attempt,
                "retry_in": retry_in,
                "source": self.spec.display,
                "backend": self.backend,
            },
        )
        try:
            self._on_status(change)
        except Exception:
            log.exception("on_status callback failed", extra={"stream_id": self.stream_id})
