"""The event kind catalogue: one declaration per kind, which the bus and the DataChannel read."""

from __future__ import annotations

from pipelines.events import DURABLE_KINDS, KINDS, Delivery, EventKind, kinds_where
from realtime.bus.jetstream import DURABLE_SUBJECTS
from realtime.webrtc.channel import CRITICAL, LATEST_ONLY


def test_every_kind_is_declared_once_and_the_bus_and_channel_follow_the_declarations() -> None:
    assert set(KINDS) == set(EventKind)
    assert all(spec.kind is kind for kind, spec in KINDS.items())
    # The contract (docs/events.md, Durability, and the transcript of captions.md): these kinds are durable, the
    # rest are best-effort.
    durable = ("tracks", "alerts", "captions", "transcript", "translations", "descriptions", "status", "clips")
    assert {k.value for k in DURABLE_KINDS} == set(durable)
    # (In the order the kinds are declared: the core bodies', then each capability's.)
    assert {f"vidsentry.*.{k}" for k in durable} == set(DURABLE_SUBJECTS)
    assert {k.value for k in LATEST_ONLY} == {"detections", "partials"}
    assert {k.value for k in CRITICAL} == {"alerts", "captions", "transcript"}
    assert kinds_where(durable=False, delivery=Delivery.LATEST) == LATEST_ONLY
    assert not (LATEST_ONLY & DURABLE_KINDS)  # a durable kind is never skipped for a newer one
