"""Streams an operator made before us, on a real nats-server: subjects compared as NATS wildcards."""

from __future__ import annotations

import logging

import nats
import pytest
from nats.js.api import StreamConfig

from pipelines.events import EventKind
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import (
    DURABLE_SUBJECTS,
    STREAM_NAME,
    StreamConflictError,
    subject_covers,
    subjects_overlap,
)
from realtime.bus.publisher import NatsEventPublisher

from .util import event, inspector


@pytest.mark.parametrize(
    ("pattern", "subject", "covers"),
    [
        ("vidsentry.>", "vidsentry.*.tracks", True),
        ("vidsentry.*.*", "vidsentry.*.tracks", True),
        (">", "vidsentry.*.tracks", True),
        ("vidsentry.*.tracks", "vidsentry.*.tracks", True),
        ("vidsentry.*.tracks", "vidsentry.>", False),
        ("vidsentry.cam1.tracks", "vidsentry.*.tracks", False),
        ("vidsentry.*", "vidsentry.*.tracks", False),
        ("vidsentry.*.tracks.>", "vidsentry.*.tracks", False),
    ],
)
def test_coverage_is_wildcard_coverage(pattern: str, subject: str, covers: bool) -> None:
    assert subject_covers(pattern, subject) is covers


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("vidsentry.>", "vidsentry.*.alerts", True),
        ("vidsentry.cam1.alerts", "vidsentry.*.alerts", True),
        ("*.*.alerts", "vidsentry.cam1.*", True),
        ("vidsentry.*.alerts", "vidsentry.*.tracks", False),
        ("vidsentry", "vidsentry.>", False),
        ("other.>", "vidsentry.*.alerts", False),
    ],
)
def test_overlap_is_wildcard_overlap(a: str, b: str, overlap: bool) -> None:
    assert subjects_overlap(a, b) is overlap
    assert subjects_overlap(b, a) is overlap


async def add_stream(url: str, name: str, subjects: list[str]) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(StreamConfig(name=name, subjects=subjects, duplicate_window=120))
    finally:
        await nc.close()


async def test_a_vidsentry_stream_that_takes_all_of_vidsentry_is_used_as_it_is(
    nats_server: EmbeddedNatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="realtime.bus.jetstream")
    await add_stream(nats_server.url, STREAM_NAME, ["vidsentry.>"])
    async with NatsEventPublisher(nats_server.url, node="test") as pub, inspector(nats_server.url) as insp:
        await pub.publish(event(EventKind.TRACKS, "gate"))
        assert await pub.flush(10)
        assert pub.stats.totals().acked == 1
        info = await insp.js.stream_info(STREAM_NAME)
        assert info.config.subjects == ["vidsentry.>"]  # not widened with subjects it already has
        assert info.state.messages == 1
    assert any("covers the durable subjects" in r.getMessage() for r in caplog.records)


async def test_another_stream_that_owns_vidsentry_subjects_is_named_as_the_conflict(
    nats_server: EmbeddedNatsServer,
) -> None:
    await add_stream(nats_server.url, "EVENTS", ["vidsentry.>"])
    pub = NatsEventPublisher(nats_server.url, node="test")
    with pytest.raises(StreamConflictError) as info:
        await pub.connect()
    message = str(info.value)
    assert "EVENTS" in message and "vidsentry.>" in message and "remove" in message
    assert "\n" not in message


async def test_a_stream_that_takes_part_of_a_missing_subject_is_a_conflict_too(
    nats_server: EmbeddedNatsServer,
) -> None:
    await add_stream(nats_server.url, STREAM_NAME, [s for s in DURABLE_SUBJECTS if not s.endswith(".alerts")])
    await add_stream(nats_server.url, "FRONT_DOOR", ["vidsentry.door.alerts"])
    pub = NatsEventPublisher(nats_server.url, node="test")
    with pytest.raises(StreamConflictError, match=r"FRONT_DOOR already takes vidsentry\.door\.alerts"):
        await pub.connect()


async def test_streams_on_other_subjects_are_no_conflict(nats_server: EmbeddedNatsServer) -> None:
    await add_stream(nats_server.url, "ORDERS", ["orders.>", "vidsentry"])
    async with NatsEventPublisher(nats_server.url, node="test") as pub, inspector(nats_server.url) as insp:
        info = await insp.js.stream_info(STREAM_NAME)
        assert info.config.subjects == list(DURABLE_SUBJECTS)
        assert pub.connected
