"""The timeline in a fleet: one worker indexes, every worker answers.

The indexer runs on the worker that holds the fleet's `timeline` lease (the fleet's lease code,
in a roles bucket of its own). While it holds it, that worker also answers the fleet's searches on
`_VIDSENTRY.timeline.<fleet>` (NATS request/reply); any other worker forwards its searches there.
When the holder dies its lease runs out (the fleet's TTL) and another worker takes it: its own
index file carries on from its own position in JetStream, so it catches up with nothing missing
and, event ids being unique in an index, nothing doubled.

The request carries what the user typed (the query text or the question), never an FTS5
expression: the holder parses it again with the same rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from pipelines.tasks import TaskOwner, cancel_and_wait, check_cancelled
from realtime.leases.buckets import open_roles
from realtime.leases.keeper import LeaseKeeper
from realtime.leases.options import FleetOptions
from realtime.timeline.errors import IndexUnavailable, QueryTooBroad, RemoteRefusal
from realtime.timeline.index import Filters, Hit
from realtime.timeline.query import QueryError, parse, retrieval_query

log = logging.getLogger(__name__)

ROLE = "timeline"
FORWARD_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 64 * 1024


def subject(fleet: str) -> str:
    return f"_VIDSENTRY.timeline.{fleet}"


def hit_to_json(hit: Hit) -> dict[str, Any]:
    return dataclasses.asdict(hit)


def hit_from_json(body: dict[str, Any]) -> Hit:
    body = dict(body)
    body["marks"] = [tuple(m) for m in body.get("marks") or ()]
    return Hit(**body)


def filters_to_json(filters: Filters) -> dict[str, Any]:
    return dataclasses.asdict(filters)


def filters_from_json(body: dict[str, Any]) -> Filters:
    return Filters(tuple(str(s) for s in body.get("streams") or ()), tuple(str(k) for k in body.get("kinds") or ()),
                   body.get("since"), body.get("until"))


class IndexerRole:
    """Hold the `timeline` lease when it is free; index and answer while holding it."""

    def __init__(self, run_indexer: Callable[[], Any], answer: Callable[[dict[str, Any]], Any],
                 connection: Callable[[], NatsClient | None], options: FleetOptions) -> None:
        self._run_indexer = run_indexer  # the indexer's run(): a coroutine to run while holding
        self._answer = answer  # a request -> the reply body (runs the search locally)
        self._connection = connection
        self.options = options
        self.subject = subject(options.name)
        self.held = False
        self._tasks = TaskOwner("timeline role")  # the indexer, while this worker holds the role

    async def run(self) -> None:
        keeper: LeaseKeeper | None = None
        indexer: asyncio.Task[Any] | None = None
        responder: Any = None
        try:
            while True:
                check_cancelled()  # nats-py's requests can swallow our cancel
                nc = self._connection()
                if nc is not None and nc.is_connected:
                    try:
                        if keeper is None:
                            kv = await open_roles(nc.jetstream(), self.options.name,
                                                  lease_ttl_s=self.options.lease_ttl_s, replicas=self.options.replicas)
                            keeper = LeaseKeeper(kv, self.options.node, self.options.lease_ttl_s)
                        if ROLE in keeper:
                            await keeper.renew(ROLE)
                        else:
                            await keeper.acquire(ROLE)
                    except (nats.errors.Error, nats.js.errors.Error, TimeoutError, OSError) as exc:
                        log.debug("timeline role: %s", exc)
                holds = keeper is not None and keeper.token(ROLE) is not None
                if holds and not self.held:
                    assert nc is not None
                    self.held = True
                    log.info("this worker now indexes the fleet's timeline", extra={"fleet": self.options.name})
                    indexer = self._tasks.spawn(self._run_indexer(), "timeline-indexer")
                    responder = await nc.subscribe(self.subject, queue="timeline", cb=self._on_request)
                elif not holds and self.held:
                    self.held = False
                    log.warning("timeline lease lost: another worker indexes now", extra={"fleet": self.options.name})
                    responder, indexer = await _stop(responder, indexer)
                    if keeper is not None:
                        keeper.drop_expired()
                await asyncio.sleep(self.options.renew_interval_s)
        finally:
            await _stop(responder, indexer)
            if keeper is not None and ROLE in keeper:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2.0):
                        await keeper.release(ROLE)  # the next worker takes it at once

    async def _on_request(self, msg: Msg) -> None:
        try:
            if len(msg.data) > MAX_REQUEST_BYTES:
                raise RemoteRefusal("request too large")
            request = json.loads(msg.data)
            reply = await self._answer(request)
        except (QueryError, RemoteRefusal, ValueError, KeyError, TypeError) as exc:
            reply = {"error": str(exc), "status": 400}
        except QueryTooBroad as exc:
            reply = {"error": str(exc), "status": 400, "too_broad": True}
        with contextlib.suppress(nats.errors.Error):
            await msg.respond(json.dumps(reply).encode())


async def _stop(responder: Any, indexer: asyncio.Task[Any] | None) -> tuple[None, None]:
    if responder is not None:
        with contextlib.suppress(Exception):
            await responder.unsubscribe()
    if indexer is not None:
        await cancel_and_wait(indexer)
    return None, None


async def forward(nc: NatsClient | None, fleet: str, request: dict[str, Any]) -> dict[str, Any]:
    """Send a search to the worker that holds the index; its reply body. IndexUnavailable when none
    answers in time, RemoteRefusal for a request it refused (with its reason)."""
    if nc is None or not nc.is_connected:
        raise IndexUnavailable("not connected to NATS")
    try:
        msg = await nc.request(subject(fleet), json.dumps(request).encode(), timeout=FORWARD_TIMEOUT_S)
    except nats.errors.NoRespondersError:
        raise IndexUnavailable("no worker holds the fleet's index right now (it is moving); retry shortly") \
            from None
    except (nats.errors.TimeoutError, TimeoutError):
        raise IndexUnavailable(f"the worker holding the fleet's index did not answer within {FORWARD_TIMEOUT_S:g} s") \
            from None
    reply: dict[str, Any] = json.loads(msg.data)
    if "error" in reply:
        if reply.get("too_broad"):
            raise QueryTooBroad(str(reply["error"]))
        raise RemoteRefusal(str(reply["error"]))
    return reply


def parse_remote(request: dict[str, Any]) -> tuple[str, Any, Filters]:
    """(op, parsed query, filters) from a forwarded request, parsed as a local one is."""
    op = request["op"]
    filters = filters_from_json(request.get("filters") or {})
    if op == "search":
        return op, parse(str(request["q"])), filters
    if op == "retrieve":
        return op, retrieval_query(str(request["question"])), filters
    raise RemoteRefusal(f"unknown op {str(op)[:20]!r}")
