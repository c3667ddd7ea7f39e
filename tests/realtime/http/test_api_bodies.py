"""POST /api/streams bodies that once got through (issue 7): strict JSON types, no Infinity or
NaN, and bounded polygons and rule lists. The real service, real detector and nats-server."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from realtime.http.api import validate_stream
from realtime.http.handlers import MAX_BODY_BYTES
from tests.support.service import LiveService

UNREACHABLE = "rtsp://127.0.0.1:1/cam"
STREAM = '{"id": "a", "url": "rtsp://127.0.0.1:1/cam", '  # the raw start of a body; each case ends it


def circle(n: int, radius: float = 400.0) -> list[list[float]]:
    return [[round(500 + radius * math.cos(2 * math.pi * i / n), 1),
             round(500 + radius * math.sin(2 * math.pi * i / n), 1)] for i in range(n)]


def refuse_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def post_raw(svc: LiveService, body: str) -> tuple[int, Any]:
    reply = await svc.call("POST", "/api/streams", data=body)
    return reply.status, reply.body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(STREAM + '"detect_fps": Infinity}', "detect_fps", id="infinity"),
        pytest.param(STREAM + '"detect_fps": 1e999}', "detect_fps", id="1e999"),
        pytest.param(
            STREAM + '"rules": [{"id": "z", "type": "zone", "polygon": [[0, 0], [9, NaN], [9, 9]]}]}',
            "rules.0.zone.polygon.1.1",
            id="nan-point",
        ),
        pytest.param(STREAM + '"audio": "yes"}', "audio", id="string-for-bool"),
        pytest.param(STREAM + '"realtime": 1}', "realtime", id="number-for-bool"),
        pytest.param(STREAM + '"detect_fps": "5"}', "detect_fps", id="string-for-number"),
        pytest.param(
            STREAM + '"rules": [{"id": "f", "type": "fall", "snapshot": "true"}]}',
            "rules.0.fall.snapshot",
            id="string-for-bool-in-a-rule",
        ),
    ],
)
async def test_non_finite_numbers_and_loose_types_are_400_naming_the_field(
    svc: LiveService, body: str, field: str
) -> None:
    status, reply = await post_raw(svc, body)
    assert status == 400, reply
    assert [p["field"] for p in reply["detail"]] == [field], reply
    # Nothing was added, and what the API lists is strict JSON a browser can parse.
    listed = await svc.session.get(svc.url + "/api/streams")
    assert json.loads(await listed.text(), parse_constant=refuse_constants) == {"streams": []}


async def test_a_well_typed_body_is_still_accepted(svc: LiveService) -> None:
    rule = {"id": "z", "type": "zone", "polygon": circle(16), "events": ["enter", "exit"], "snapshot": True}
    body = {"id": "a", "url": UNREACHABLE, "detect_fps": 5, "audio": False, "rules": [rule]}
    reply = await svc.call("POST", "/api/streams", json_body=body)
    assert reply.status == 201, reply
    assert reply.body["detect_fps"] == 5 and reply.body["rules"][0]["events"] == ["enter", "exit"]


async def test_a_huge_polygon_or_too_many_rules_is_400_naming_the_key(svc: LiveService) -> None:
    huge = {"id": "a", "url": UNREACHABLE, "rules": [{"id": "z", "type": "zone", "polygon": circle(300)}]}
    reply = await svc.call("POST", "/api/streams", json_body=huge)
    assert reply.status == 400, reply
    assert reply.body["detail"] == [
        {"field": "rules.0.zone.polygon", "message": "a polygon has at most 256 points, got 300"}
    ]
    many = {"id": "a", "url": UNREACHABLE, "rules": [{"id": f"r{i}", "type": "count", "above": 1} for i in range(65)]}
    reply = await svc.call("POST", "/api/streams", json_body=many)
    assert reply.status == 400 and reply.body["detail"][0]["field"] == "rules", reply
    assert "at most 64 rules" in reply.body["detail"][0]["message"]


def test_a_body_at_the_size_limit_full_of_the_largest_polygons_is_valid() -> None:
    # The caps bound the work, not what a real zone can be: 64 KiB holds about 26 such zones.
    polygon = [[int(500 + 499 * math.cos(2 * math.pi * i / 256)), int(500 + 499 * math.sin(2 * math.pi * i / 256))]
               for i in range(256)]
    rules = [{"id": f"z{i}", "type": "zone", "polygon": polygon} for i in range(64)]
    body = {"id": "a", "url": UNREACHABLE, "rules": rules}
    while len(json.dumps(body, separators=(",", ":"))) > MAX_BODY_BYTES:
        rules.pop()
    settings = validate_stream(json.loads(json.dumps(body)))
    assert len(settings.rules) == len(rules) > 20
