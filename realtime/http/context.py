"""What the HTTP handlers reach: one object stored on the aiohttp application."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from realtime.http.history import JetStreamHistory
from realtime.http.hosts import HostPolicy
from realtime.http.metrics import ServiceMetrics
from realtime.http.resume import ResumeSettings
from realtime.http.signed import UrlSigner
from realtime.streams.fanout import EventFanout
from realtime.streams.registry import StreamRegistry


@dataclass(eq=False)
class HttpContext:
    registry: StreamRegistry
    fanout: EventFanout
    metrics: ServiceMetrics
    readiness: Callable[[], dict[str, bool]]  # named checks; ready when all are true
    api_token: bytes | None = field(default=None, repr=False)  # None: /api is open (loopback only)
    sse_heartbeat_s: float = 15.0
    class_names: Mapping[int, str] = field(default_factory=dict)  # the detector's; rules must use them
    # The capabilities whose engines are open: streams may have the rule types they answer.
    capabilities_on: frozenset[str] = frozenset()
    # Their engines, by capability name: a stream's own settings of one are checked against it.
    engines: Mapping[str, object] = field(default_factory=dict)
    draining: bool = False  # shutting down: mutations are refused, readiness fails
    # Host names answered (DNS rebinding); the service sets it once it knows the bind address.
    hosts: HostPolicy = field(default_factory=lambda: HostPolicy("127.0.0.1", None, token_set=False))
    history: JetStreamHistory | None = None  # where reconnecting event viewers resume from; None: recent only
    resume: ResumeSettings = field(default_factory=ResumeSettings)
    request_timeout_s: float = 30.0  # http.request_timeout_s: a request, or an event-stream write
    signer: UrlSigner = field(default_factory=UrlSigner, repr=False)  # links a <video src> can open


APP_CONTEXT = web.AppKey("vidsentry_context", HttpContext)


def context_of(request: web.Request) -> HttpContext:
    return request.app[APP_CONTEXT]
