"""Rule config: every type loads from YAML; bad rules are errors that name the key."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from pipelines.rules.engine import RuleEngine, RuleError
from pipelines.rules.geometry import is_simple_polygon, segments_intersect
from pipelines.rules.specs import (
    MAX_POLYGON_POINTS,
    MAX_RULES,
    CountRule,
    FallRule,
    LineRule,
    PresentRule,
    RuleList,
    ZoneRule,
)
from realtime.config import Config, ConfigError, load_config
from tests.pipelines.rules.script import NAMES, rules

GOOD = """
streams:
  - id: plaza
    url: rtsp://cam/1
    rules:
      - {id: people, type: present, classes: [Normal], for_s: 2, severity: info}
      - {id: empty, type: absent, zone: [[0, 0.5], [1, 0.5], [1, 1]], normalized: true, for_s: 60}
      - {id: crowd, type: count, above: 5, for_s: 10, cooldown_s: 300, snapshot: true}
      - id: door
        type: zone
        polygon: [[100, 400], [300, 400], [300, 576], [100, 576]]
        events: [enter, exit, dwell]
        dwell_s: 30
      - {id: gate, type: line, points: [[0, 300], [768, 300]], direction: a_to_b}
      - {id: fallen, type: fall, for_s: 3, severity: critical}
"""


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "vidsentry.yaml"
    path.write_text(text)
    return load_config(path, environ={})


def test_every_rule_type_loads(tmp_path: Path) -> None:
    loaded = load(tmp_path, GOOD).streams[0].rules
    assert [r.type for r in loaded] == ["present", "absent", "count", "zone", "line", "fall"]
    people, _, crowd, door, gate, fallen = loaded
    assert isinstance(people, PresentRule) and people.classes == ("Normal",) and people.severity == "info"
    assert isinstance(crowd, CountRule) and crowd.above == 5 and crowd.snapshot
    assert isinstance(door, ZoneRule) and door.events == ("enter", "exit", "dwell") and door.dwell_s == 30
    assert isinstance(gate, LineRule) and gate.points == ((0, 300), (768, 300))
    assert isinstance(fallen, FallRule) and fallen.fall_class == "Fall" and fallen.cooldown_s == 30
    RuleEngine("plaza", loaded, NAMES)  # and they run against the bundled model's classes


@pytest.mark.parametrize(
    ("rule", "needle"),
    [
        ("{id: r, type: zonee}", "streams.0.rules.0: type: 'zonee' is not a rule type"),
        ("{id: r}", "streams.0.rules.0: type: missing"),
        (
            "{id: r, type: zone, polygon: [[0, 0], [10, 10], [10, 0], [0, 10]]}",
            "streams.0.rules.0.zone.polygon: the polygon's edges cross",
        ),
        (
            "{id: r, type: zone, polygon: [[0, 0], [10, 10]]}",
            "streams.0.rules.0.zone.polygon: a polygon needs at least 3",
        ),
        (
            "{id: r, type: zone, polygon: [[0, 0], [9, 0], [9, 9]], colour: red}",
            "streams.0.rules.0.zone.colour: unknown key",
        ),
        ("{id: r, type: zone, polygon: [[0, 0], [9, 0], [9, 9]], events: [dwell]}", "streams.0.rules.0.zone.dwell_s"),
        ("{id: r, type: present, zone: [[0, 0], [2, 0], [2, 2]], normalized: true}", "streams.0.rules.0.present.zone"),
        ("{id: r, type: count, for_s: 3}", "set exactly one of above or below"),
        ("{id: 'a b', type: fall}", "streams.0.rules.0.fall.id"),
        ("{id: r, type: line, points: [[5, 5], [5, 5]]}", "streams.0.rules.0.line.points"),
        ("{id: r, type: line, points: [[0, 0], [9, 9]], direction: up}", "streams.0.rules.0.line.direction"),
        ("{id: r, type: fall, severity: loud}", "streams.0.rules.0.fall.severity"),
        ("{id: r, type: present, cooldown_s: -1}", "streams.0.rules.0.present.cooldown_s"),
    ],
)
def test_bad_rule_names_the_key(tmp_path: Path, rule: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"streams:\n  - id: cam\n    url: rtsp://cam/1\n    rules:\n      - {rule}\n")
    assert needle in str(info.value)


def test_rule_ids_are_unique_per_stream() -> None:
    with pytest.raises(ValidationError, match="duplicate rule id 'r'"):
        TypeAdapter(RuleList).validate_python([{"id": "r", "type": "fall"}, {"id": "r", "type": "present"}])
    twice = [*rules({"id": "r", "type": "fall"}), *rules({"id": "r", "type": "present"})]
    with pytest.raises(RuleError, match="duplicate rule id"):
        RuleEngine("cam", twice, NAMES)


def test_class_the_model_does_not_have_is_an_error_naming_both() -> None:
    with pytest.raises(RuleError) as info:
        RuleEngine("cam", rules({"id": "cars", "type": "present", "classes": ["car"]}), NAMES)
    assert "'cars'" in str(info.value) and "'car'" in str(info.value) and "Fall, Normal" in str(info.value)


def test_rules_round_trip_through_json(tmp_path: Path) -> None:
    # The HTTP API returns a stream's rules as JSON and accepts them back.
    loaded = load(tmp_path, GOOD).streams[0].rules
    adapter = TypeAdapter(RuleList)
    assert adapter.validate_json(adapter.dump_json(loaded)) == loaded


# -- bounded validation (issue 7, item 12) and finite numbers (item 15) -----------------------


def circle(n: int, radius: float = 400.0) -> list[list[float]]:
    return [
        [500 + radius * math.cos(2 * math.pi * i / n), 500 + radius * math.sin(2 * math.pi * i / n)] for i in range(n)
    ]


def test_a_polygon_has_at_most_256_points() -> None:
    adapter = TypeAdapter(RuleList)
    assert adapter.validate_python([{"id": "z", "type": "zone", "polygon": circle(MAX_POLYGON_POINTS)}])
    for rule in ({"id": "z", "type": "zone", "polygon": circle(7200)}, {"id": "p", "type": "present",
                                                                            "zone": circle(257)}):
        with pytest.raises(ValidationError) as info:
            adapter.validate_python([rule])
        (error,) = info.value.errors()
        assert error["loc"][-1] in ("polygon", "zone")
        assert "a polygon has at most 256 points" in error["msg"]


def test_a_stream_has_at_most_64_rules(tmp_path: Path) -> None:
    many = "".join(f"      - {{id: r{i}, type: fall}}\n" for i in range(MAX_RULES + 1))
    with pytest.raises(ConfigError, match="streams.0.rules: a stream has at most 64 rules, got 65"):
        load(tmp_path, f"streams:\n  - id: cam\n    url: rtsp://cam/1\n    rules:\n{many}")
    at_most = many[: many.rindex("      -")]
    stream = load(tmp_path, f"streams:\n  - id: cam\n    url: rtsp://cam/1\n    rules:\n{at_most}").streams[0]
    assert len(stream.rules) == MAX_RULES == 64


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_rules_refuse_non_finite_numbers(bad: float) -> None:
    adapter = TypeAdapter(RuleList)
    for rule in (
        {"id": "z", "type": "zone", "polygon": [[0, 0], [9, bad], [9, 9]]},
        {"id": "l", "type": "line", "points": [[0, 0], [bad, 9]]},
        {"id": "c", "type": "count", "above": 1, "for_s": bad},
        {"id": "f", "type": "fall", "cooldown_s": bad},
    ):
        with pytest.raises(ValidationError, match="finite number"):
            adapter.validate_python([rule])


def test_lists_become_tuples_so_json_can_be_checked_strictly() -> None:
    adapter = TypeAdapter(RuleList)
    rule = {"id": "z", "type": "zone", "polygon": [[0, 0], [9, 0], [9, 9]], "events": ["enter"], "classes": ["A"]}
    (zone,) = adapter.validate_python([rule], strict=True)
    assert isinstance(zone, ZoneRule) and zone.polygon == ((0, 0), (9, 0), (9, 9)) and zone.classes == ("A",)
    with pytest.raises(ValidationError, match="valid boolean"):
        adapter.validate_python([{**rule, "snapshot": "yes"}], strict=True)


def pairwise_simple(polygon: list[tuple[float, float]]) -> bool:
    """The plain definition: no two non-adjacent edges touch."""
    n = len(polygon)
    edges = [(polygon[i], polygon[(i + 1) % n]) for i in range(n)]
    return not any(
        segments_intersect(*edges[i], *edges[j])
        for i in range(n)
        for j in range(i + 2, n)
        if not (i == 0 and j == n - 1)
    )


def test_the_vectorised_simple_polygon_check_agrees_with_the_definition() -> None:
    rng = random.Random(7)
    outcomes = set()
    for _ in range(3000):
        grid = rng.choice([2, 4, 50])  # small grids make touching, collinear and repeated points common
        polygon = [(float(rng.randint(0, grid)), float(rng.randint(0, grid))) for _ in range(rng.randint(3, 80))]
        if rng.random() < 0.5:  # in angle order around the middle: mostly simple, sometimes just touching
            polygon.sort(key=lambda p: math.atan2(p[1] - grid / 2 - 0.1, p[0] - grid / 2 - 0.1))
        simple = is_simple_polygon(polygon)
        assert simple == pairwise_simple(polygon), polygon
        outcomes.add(simple)
    assert outcomes == {True, False}
    assert is_simple_polygon([(x, y) for x, y in circle(MAX_POLYGON_POINTS)])
