"""Probes and metrics: `/healthz` (the process answers), `/readyz` (it can do its job), `/metrics`."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from realtime.http.context import context_of
from realtime.http.errors import json_error


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ctx = context_of(request)
    checks = {**ctx.readiness(), "accepting": not ctx.draining}
    if all(checks.values()):
        return web.json_response({"ready": True, "checks": checks})
    failing = sorted(name for name, ok in checks.items() if not ok)
    return json_error(503, "not ready", {"failing": failing, "checks": checks})


async def metrics(request: web.Request) -> web.Response:
    body = await context_of(request).metrics.render_shared()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
