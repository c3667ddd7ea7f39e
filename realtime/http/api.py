"""`/api/streams`: the desired set of streams, read and written over HTTP.

A POST body is one stream object with the same fields as a stream in the YAML config and is
validated by the same pydantic model, so the API and the file accept exactly the same things,
with strict types: JSON says what it means, so `"audio": "yes"` is an error rather than true.
Its rules are checked against the detector's class names too, and its URL against the
`sources` policy (`SOURCE_POLICY`): an API client may not make the service read local files or
probe internal networks unless the operator allows it.

Numbers are range-checked as the config's are: a JSON body is parsed with hooks that refuse, by
field name, an integer of more than MAX_INT_DIGITS digits (Python's own int conversion fails
past 4,300 digits with a message about `sys.set_int_max_str_digits`, and costs quadratic time
before that) and a float that underflows to 0 (`1e-400` is not 0); pydantic's bounds do
the rest. An error lists at most MAX_PROBLEMS_SHOWN problems.
"""

from __future__ import annotations

import asyncio
import json
from functools import partial
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from pipelines.frames import InvalidStreamId, validate_stream_id
from realtime.config import (
    STREAM_SETTINGS,
    WEBRTC_NOT_CONFIGURABLE,
    AnyStreamSettings,
    CameraStreamSettings,
    WebRtcStreamSettings,
    describe_problems,
    first_problems,
    validation_problems,
)
from realtime.config_checks import own_settings_problems, rule_class_problems, rule_need_problems
from realtime.config_yaml import float_problem, integer_problem
from realtime.fleet.worker import FleetUnavailable, FleetWorker
from realtime.http.context import context_of
from realtime.http.errors import ApiError
from realtime.sources.policy import SourcePolicy
from realtime.sources.spec import InvalidSource
from realtime.streams.registry import RegistryClosed, StreamExists, StreamLimitReached, UnknownStream

# What URLs API clients may add; the service sets it from `sources:`. Without it, the strictest.
SOURCE_POLICY = web.AppKey("vidsentry_source_policy", SourcePolicy)
# Set when this worker is in a fleet: the desired set is the fleet's (NATS KV), listed with each owner.
FLEET = web.AppKey("vidsentry_fleet", FleetWorker)

ID_RULE = "use 1-64 characters from A-Z a-z 0-9 _ -"


def stream_id_of(request: web.Request) -> str:
    stream_id = request.match_info["stream_id"]
    try:
        return validate_stream_id(stream_id)
    except InvalidStreamId:
        raise ApiError(400, "invalid stream id", {"field": "id", "message": ID_RULE}) from None


def unknown_stream(stream_id: str) -> ApiError:
    return ApiError(404, "unknown stream", {"id": stream_id})


def owner_elsewhere(request: web.Request, stream_id: str) -> str | None:
    """None for a stream this worker runs; in a fleet, the worker that runs it ("" while none
    does); 404 for a stream that is not known."""
    if stream_id in context_of(request).registry:
        return None
    fleet = request.app.get(FLEET)
    if fleet is not None:
        try:
            return str(fleet.view(stream_id).get("owner") or "")
        except UnknownStream:
            pass
    raise unknown_stream(stream_id)


def runs_elsewhere(stream_id: str, owner: str, what: str) -> ApiError:
    """409 for what only the worker holding the stream's video can do (`what`), naming that worker."""
    where = f"worker {owner}" if owner else "no worker yet"
    return ApiError(409, f"this stream runs on {where}; {what} is answered by the worker that runs it",
                    {"id": stream_id, "owner": owner or None})


def require_local_stream(request: web.Request, stream_id: str, what: str) -> None:
    """404 for a stream nobody runs; in a fleet, 409 naming the worker that runs it."""
    owner = owner_elsewhere(request, stream_id)
    if owner is not None:
        raise runs_elsewhere(stream_id, owner, what)


STREAM_EXAMPLE = '{"id": "cam1", "url": "rtsp://..."}'


async def read_json_object(
    request: web.Request, *, what: str = "stream object", example: str = STREAM_EXAMPLE
) -> dict[str, Any]:
    raw = await request.read()  # bounded by the app's client_max_size (413 past it)
    if not raw.strip():
        raise ApiError(400, "missing body", f"send one {what} as JSON, e.g. {example}")
    bad: list[_BadNumber] = []
    try:
        body = json.loads(raw, parse_int=partial(_parse_int, bad), parse_float=partial(_parse_float, bad))
    except ValueError as exc:  # includes UnicodeDecodeError
        raise ApiError(400, "bad JSON", str(exc)) from None
    except RecursionError:
        raise ApiError(400, "bad JSON", "nested too deeply") from None
    if bad:
        field, reason = _find_bad_number(body)
        raise ApiError(400, f"invalid {what}: {field}: {reason}", [{"field": field, "message": reason}])
    if not isinstance(body, dict):
        raise ApiError(400, "bad JSON", f"expected one {what}, got {type(body).__name__}")
    return body


class _BadNumber:
    """Stands in the parsed body for a number no field can hold, until its field is known."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _parse_int(bad: list[_BadNumber], text: str) -> int | _BadNumber:
    reason = integer_problem(text)
    if reason is None:
        return int(text)
    bad.append(_BadNumber(reason))
    return bad[-1]


def _parse_float(bad: list[_BadNumber], text: str) -> float | _BadNumber:
    value = float(text)
    reason = float_problem(text, value)
    if reason is None:
        return value
    bad.append(_BadNumber(reason))
    return bad[-1]


def _find_bad_number(body: Any) -> tuple[str, str]:
    """The first bad number's field (`rules.0.above`) and reason; iterative, as the body may be deep."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, field = stack.pop()
        if isinstance(value, _BadNumber):
            return field or "(top level)", value.reason
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        children = [(child, f"{field}.{str(key)[:64]}" if field else str(key)[:64]) for key, child in items]
        stack.extend(reversed(children))
    return "(top level)", "a number out of range"


def fleet_unavailable(exc: FleetUnavailable) -> ApiError:
    return ApiError(503, "fleet store unavailable", str(exc), headers={"Retry-After": "2"})


async def list_streams(request: web.Request) -> web.Response:
    fleet = request.app.get(FLEET)
    if fleet is not None:
        return web.json_response({"streams": fleet.views()})
    views = context_of(request).registry.views()
    return web.json_response({"streams": [view.to_json() for view in views]})


def validate_stream(body: dict[str, Any]) -> AnyStreamSettings:
    try:
        return STREAM_SETTINGS.validate_python(body, strict=True)
    except ValidationError as exc:
        problems = validation_problems(exc, unknown="unknown field")
        raise ApiError(400, f"invalid stream: {describe_problems(problems)}", first_problems(problems)) from None


def refused_url(exc: InvalidSource) -> ApiError:
    return ApiError(400, f"invalid stream: url: {exc}", [{"field": "url", "message": str(exc)}])


async def create_stream(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    policy = request.app.get(SOURCE_POLICY) or SourcePolicy()
    try:
        policy.check_form(body.get("url"))  # first: a path outside the allowed directories is never looked at
    except InvalidSource as exc:
        raise refused_url(exc) from None
    # Off the event loop: a body at the size limit full of polygons takes tens of milliseconds.
    settings = await asyncio.to_thread(validate_stream, body)
    if isinstance(settings, CameraStreamSettings):
        try:
            await policy.admit(settings.url)  # regular files only; public hosts unless allowed
        except InvalidSource as exc:
            raise refused_url(exc) from None
    if isinstance(settings, WebRtcStreamSettings):
        raise ApiError(400, f"invalid stream: kind: {WEBRTC_NOT_CONFIGURABLE}", [
            {"field": "kind", "message": WEBRTC_NOT_CONFIGURABLE}
        ])
    context = context_of(request)
    problems = rule_class_problems(settings, context.class_names)
    problems += rule_need_problems(settings, context.capabilities_on)
    problems += [problem for _, problem in own_settings_problems([settings], context.engines)]
    if problems:
        raise ApiError(400, f"invalid stream: {describe_problems(problems)}", problems)
    fleet = request.app.get(FLEET)
    try:
        body = await fleet.add(settings) if fleet is not None else context_of(request).registry.add(settings).to_json()
    except StreamExists:
        raise ApiError(409, "stream exists", {"id": settings.id}) from None
    except StreamLimitReached as exc:
        raise ApiError(429, str(exc), {"limit": exc.limit, "setting": exc.setting}) from None
    except RegistryClosed:
        raise ApiError(503, "shutting down", "the service is draining", headers={"Retry-After": "5"}) from None
    except FleetUnavailable as exc:
        raise fleet_unavailable(exc) from None
    return web.json_response(body, status=201, headers={"Location": f"/api/streams/{settings.id}"})


async def get_stream(request: web.Request) -> web.Response:
    stream_id = stream_id_of(request)
    fleet = request.app.get(FLEET)
    try:
        body = fleet.view(stream_id) if fleet is not None else context_of(request).registry.get(stream_id).to_json()
    except UnknownStream:
        raise unknown_stream(stream_id) from None
    return web.json_response(body)


async def delete_stream(request: web.Request) -> web.Response:
    """Removes the stream from the desired set; the reconciler stops it (its open tracks end)."""
    stream_id = stream_id_of(request)
    fleet = request.app.get(FLEET)
    try:
        if fleet is not None:
            await fleet.remove(stream_id)  # every worker sees it; the owner stops it
        else:
            context_of(request).registry.remove(stream_id)
    except UnknownStream:
        raise unknown_stream(stream_id) from None
    except RegistryClosed:
        raise ApiError(503, "shutting down", "the service is draining", headers={"Retry-After": "5"}) from None
    except FleetUnavailable as exc:
        raise fleet_unavailable(exc) from None
    return web.Response(status=204)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/streams", list_streams)
    app.router.add_post("/api/streams", create_stream)
    app.router.add_get("/api/streams/{stream_id}", get_stream)
    app.router.add_delete("/api/streams/{stream_id}", delete_stream)
