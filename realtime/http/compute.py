"""`GET /api/compute`: what the compute budget decides (pipelines.compute): its cores and, per model,
its claim, its recent part of the cores and its waits. `{"scheduler": false}` when no budget runs
(the scheduler is off, or no two models share the CPU)."""

from __future__ import annotations

from aiohttp import web

from pipelines.compute import ComputeBudget

BUDGET = web.AppKey("vidsentry_compute_budget", ComputeBudget)


async def compute_state(request: web.Request) -> web.Response:
    budget = request.app.get(BUDGET)
    body = {"scheduler": False} if budget is None else {"scheduler": True, **budget.snapshot()}
    return web.json_response(body, headers={"Cache-Control": "no-store"})


def add_routes(app: web.Application, budget: ComputeBudget | None) -> None:
    if budget is not None:
        app[BUDGET] = budget
    app.router.add_get("/api/compute", compute_state)
