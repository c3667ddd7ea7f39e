"""A publisher's delivery hooks that write down what they are told, for tests to read back."""

from __future__ import annotations

from realtime.bus.delivery import WireMessage


class RecordingHooks:
    """`acked`: (event id, duplicate) per ack; `lost`: (event id, error class name) per event
    handed over as undeliverable."""

    def __init__(self) -> None:
        self.acked: list[tuple[str, bool]] = []
        self.lost: list[tuple[str, str]] = []

    def on_acked(self, msg: WireMessage, delay_s: float, duplicate: bool) -> None:
        assert delay_s >= 0
        self.acked.append((msg.event_id, duplicate))

    def on_undeliverable(self, msg: WireMessage, error: BaseException) -> None:
        self.lost.append((msg.event_id, type(error).__name__))

    @property
    def errors(self) -> list[str]:
        """The error class names of the events lost, in order."""
        return [error for _, error in self.lost]
