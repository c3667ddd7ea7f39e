"""Outages: retries within a budget, circuits that open and close, streams that move and come back."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest

from engines.vlm.errors import VlmUnavailable
from engines.vlm.resilience import BreakerState, CircuitBreaker, RetryBudget
from engines.vlm.routing import rendezvous_order
from tests.engines.vlm.builders import question
from tests.engines.vlm.conftest import MakeClient
from tests.support.clock import FakeClock
from tests.support.vllm_sim import VllmSimulator


async def test_an_outage_opens_the_circuit_fails_fast_and_recovers(
    sim: VllmSimulator, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="engines.vlm")
    clock = FakeClock(1000.0)  # the breakers' clock: an open circuit stays open until it is advanced
    client = await make_client(sim.url, max_retries=2, breaker_failures=3, breaker_reset_s=0.4, clock=clock)
    assert (await client.complete(question())).text

    sim.down = True
    with pytest.raises(VlmUnavailable, match="failed 3 times"):
        await client.complete(question())
    assert len(sim.requests) == 1 + 3  # the request and its two retries
    stats = client.stats()
    assert stats.retries == 2 and stats.endpoints[0].breaker == "open" and stats.endpoints[0].times_opened == 1

    with pytest.raises(VlmUnavailable, match="circuits open") as fast:
        await client.complete(question())
    assert fast.value.retry_after_s == 0.5  # the floor a caller is told: the 0.4 s reset is under it
    assert len(sim.requests) == 4  # failed fast, without a request

    sim.down = False
    clock.advance(0.45)  # the circuit half-opens: the next request is the probe
    assert (await client.complete(question())).text
    assert client.stats().endpoints[0].breaker == "closed"
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 2 and "is failing (HTTP 503" in said[0] and said[1].endswith("answers again")


async def test_a_server_error_is_retried_and_the_caller_never_sees_it(
    sim: VllmSimulator, make_client: MakeClient
) -> None:
    client = await make_client(sim.url, max_retries=2)
    sim.fail_next = 2
    response = await client.complete(question())
    assert response.text and len(sim.requests) == 3 and client.stats().retries == 2


async def test_the_retry_budget_stops_retries_during_a_long_outage(sim: VllmSimulator, make_client: MakeClient) -> None:
    client = await make_client(sim.url, max_retries=3, retry_budget_ratio=0.0, breaker_failures=1000)
    sim.down = True
    for _ in range(4):
        with pytest.raises(VlmUnavailable):
            await client.complete(question())
    stats = client.stats()
    assert stats.retries == 5  # the budget's floor, then no more
    assert stats.retries_denied >= 1 and len(sim.requests) == 4 + 5


async def test_two_endpoints_with_one_down_the_stream_moves_and_comes_back(make_client: MakeClient) -> None:
    async with VllmSimulator() as a, VllmSimulator() as b:
        key = next(k for k in (f"cam-{i}" for i in range(100)) if rendezvous_order(k, (a.url, b.url))[0] == a.url)
        client = await make_client(a.url, b.url, max_retries=1, breaker_failures=1, breaker_reset_s=0.3)
        assert (await client.complete(question(key=key))).endpoint == a.url

        await a.stop()  # refused connections
        moved = await client.complete(question(key=key))
        assert moved.endpoint == b.url  # the failed attempt opened a's circuit, the retry went to b
        assert (await client.complete(question(key=key))).endpoint == b.url
        assert client.stats().endpoints[0].breaker == "open"

        await a.start()
        await asyncio.sleep(0.35)
        back = await client.complete(question(key=key))
        assert back.endpoint == a.url  # home again: its prefix cache lives there
        assert len(a.requests) == 2 and len(b.requests) == 2


async def test_every_endpoint_down_is_unavailable(make_client: MakeClient) -> None:
    async with VllmSimulator() as a, VllmSimulator() as b:
        client = await make_client(
            a.url, b.url, max_retries=3, breaker_failures=1, breaker_reset_s=5.0, clock=FakeClock()
        )
        await a.stop()
        await b.stop()
        with pytest.raises(VlmUnavailable, match="circuits open") as caught:
            await client.complete(question())
        assert caught.value.retry_after_s == 5.0  # both opened now, by the breakers' still clock


def test_rendezvous_hashing_is_stable_and_moves_only_the_lost_endpoints_streams() -> None:
    endpoints = ("http://vllm-0:8000/v1", "http://vllm-1:8000/v1", "http://vllm-2:8000/v1")
    keys = [f"cam-{i}" for i in range(600)]
    homes = {key: rendezvous_order(key, endpoints)[0] for key in keys}
    assert homes == {key: rendezvous_order(key, tuple(reversed(endpoints)))[0] for key in keys}  # order-free
    assert min(Counter(homes.values()).values()) > 150  # spread: about 200 each
    remaining = endpoints[:2]
    for key in keys:
        new_home = rendezvous_order(key, remaining)[0]
        if homes[key] in remaining:
            assert new_home == homes[key]  # only streams of the removed endpoint move
        else:
            assert new_home == rendezvous_order(key, endpoints)[1]  # ...to their second choice
    # Fixed across processes and releases: a worker restart or upgrade must not reshuffle streams.
    assert "".join(str(endpoints.index(homes[f"cam-{i}"])) for i in range(24)) == "201212010212111002001002"

def test_the_breaker_opens_half_opens_for_one_probe_and_closes() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failures=2, reset_s=10.0, clock=clock)
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED and breaker.acquire()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.acquire()
    assert breaker.retry_after_s() == 10.0
    clock.advance(10.0)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.acquire() and not breaker.acquire()  # one probe at a time
    breaker.record_failure()  # the probe failed: open again, for another reset_s
    assert breaker.state is BreakerState.OPEN and breaker.times_opened == 2
    clock.advance(10.0)
    assert breaker.acquire()
    breaker.release()  # the probe was cancelled: another may go
    assert breaker.acquire()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.consecutive_failures == 0


def test_the_retry_budget_earns_a_fraction_of_a_retry_per_request() -> None:
    budget = RetryBudget(ratio=0.25, floor=1.0)
    assert budget.try_spend() and not budget.try_spend()
    for _ in range(4):
        budget.on_request()
    assert budget.try_spend() and not budget.try_spend()
