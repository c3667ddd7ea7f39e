"""What the outside world sees of one stream: its settings, state and counters.

The registry builds these for the HTTP API and the metrics collector from
`StreamRunner.counters()` (every stage's counters), which stays cheap enough for every scrape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.graph.counters import Counters
from realtime.config import AnyStreamSettings
from realtime.sources.spec import InvalidSource, parse_source

PENDING = "pending"  # desired, not started yet (or waiting for its previous run to stop)


def public_url(url: str) -> str:
    """The URL as it may be shown: a network URL's password becomes ***; paths stay as given."""
    try:
        source = parse_source(url)
    except InvalidSource:
        return url if "://" not in url else "(unparseable URL)"
    return url if source.is_file else source.display


@dataclass(frozen=True, slots=True)
class StreamView:
    settings: AnyStreamSettings
    shown_url: str | None  # None: no URL (a browser session)
    state: str  # pending, or a StreamState value
    reason: str | None
    restarts: int  # runs started after the first one (after a failure)
    restart_in: float | None  # seconds until the next start after a failure
    counters: Counters

    @property
    def stream_id(self) -> str:
        return self.settings.id

    def to_json(self) -> dict[str, Any]:
        body = self.settings.model_dump(mode="json")
        if self.shown_url is not None:
            body["url"] = self.shown_url
        body.update(
            state=self.state,
            reason=self.reason,
            restarts=self.restarts,
            restart_in=None if self.restart_in is None else round(self.restart_in, 1),
            counters=dict(self.counters),
        )
        return body
