"""Rule config: every type loads from YAML; bad rules are errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from pipelines.rules.engine import RuleEngine, RuleError
from pipelines.rules.specs import CountRule, FallRule, LineRule, PresentRule, RuleList, ZoneRule
from realtime.config import ConfigError, load_config
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


def load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
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
