"""The publisher's background tasks are supervised: one that dies makes the publisher say so."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipelines.events import EventKind
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.outbox import Outbox
from realtime.bus.publisher import NatsEventPublisher
from realtime.bus.retrying import RetryingDelivery
from realtime.bus.spooling import SpoolingDelivery
from tests.support.waiting import wait_until

from .util import event

pytestmark = pytest.mark.timeout(60)


async def test_a_replay_loop_that_dies_makes_the_publisher_not_alive(
    nats_server: EmbeddedNatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken_replay(self: SpoolingDelivery) -> None:
        raise RuntimeError("replay bug")

    monkeypatch.setattr(SpoolingDelivery, "_run_outbox", broken_replay)
    pub = NatsEventPublisher(nats_server.url, outbox=Outbox(tmp_path / "outbox", fsync_interval_s=None))
    assert pub.alive and pub.failure is None
    with caplog.at_level(logging.ERROR, logger="realtime.bus"):
        await pub.connect()
        try:
            await wait_until(lambda: not pub.alive, what="the dead replay task noticed")
            assert pub.failure is not None
            assert "nats-publisher-outbox" in pub.failure and "RuntimeError: replay bug" in pub.failure
            stats = pub.stats
            assert not stats.alive and stats.task_failures == 1
            assert pub.connected  # the link itself is fine: /readyz needs both
            await pub.publish(event(EventKind.STATUS, state="live"))  # still no exception into the pipeline
        finally:
            await pub.close()
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "replay bug" in record.getMessage() and record.exc_info is not None  # once, with the traceback
    assert not pub.alive


async def test_a_retry_loop_that_dies_makes_the_publisher_not_alive(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_retries(self: RetryingDelivery) -> None:
        raise OSError("retry bug")

    monkeypatch.setattr(RetryingDelivery, "_run_retries", broken_retries)
    async with NatsEventPublisher(nats_server.url) as pub:
        await wait_until(lambda: not pub.alive, what="the dead retry task noticed")
        assert pub.failure is not None and "OSError: retry bug" in pub.failure


async def test_a_healthy_publisher_is_alive_until_closed(nats_server: EmbeddedNatsServer, tmp_path: Path) -> None:
    pub = NatsEventPublisher(nats_server.url, outbox=Outbox(tmp_path / "outbox", fsync_interval_s=None))
    async with pub:
        await pub.publish(event(EventKind.TRACKS, track_id=1))
        assert await pub.flush(10)
        assert pub.alive and pub.failure is None and pub.stats.alive
    assert not pub.alive and pub.failure is None  # closed on purpose: not a death
    assert pub.stats.task_failures == 0
