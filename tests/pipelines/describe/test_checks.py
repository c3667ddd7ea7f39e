"""`vlm` rules: their spec, the model's yes/no parsed, and the normal alert lifecycle on the answers."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from pipelines.capabilities import RuleList
from pipelines.clock import Moment
from pipelines.describe.checks import Verdict, VlmChecks, parse_verdict
from pipelines.describe.rules import VlmRule
from pipelines.rules.engine import RuleEngine
from pipelines.rules.types import AlertEventKind

RULES: TypeAdapter[list] = TypeAdapter(RuleList)


def vlm_rule(**fields: object) -> VlmRule:
    spec = {"id": "lying", "type": "vlm", "question": "Is anyone lying on the ground?", **fields}
    (rule,) = RULES.validate_python([spec])
    assert isinstance(rule, VlmRule)
    return rule


def test_the_rule_spec() -> None:
    rule = vlm_rule(question="  Is anyone\n lying   down? ", cadence_s=4, for_s=8, severity="critical")
    assert rule.question == "Is anyone lying down?"
    assert (rule.cadence_s, rule.for_s, rule.severity, rule.clear_s) == (4.0, 8.0, "critical", 10.0)
    for bad in ({"question": ""}, {"question": "x" * 301}, {"cadence_s": 0.1}, {"colour": "red"}):
        with pytest.raises(ValidationError):
            vlm_rule(**bad)
    with pytest.raises(ValidationError, match="question"):
        RULES.validate_python([{"id": "q", "type": "vlm"}])


def test_the_frame_loops_rule_engine_leaves_vlm_rules_to_the_describer() -> None:
    engine = RuleEngine("cam", [vlm_rule()], {0: "person"})
    assert engine.rules == []
    assert engine.evaluate(Moment(1.0, 1.0), []) == []


@pytest.mark.parametrize(
    ("fields", "text", "expected"),
    [
        ({"answer": "yes", "reason": "a man lies  by the door"}, "", Verdict(True, "a man lies by the door")),
        ({"answer": "No", "reason": ""}, "", Verdict(False, "")),
        (None, '{"answer": "yes", "reason": "fell"}', Verdict(True, "fell")),
        (None, "yes, someone fell", Verdict(True, "someone fell")),  # a server that ignores the schema
        (None, "**No.** Nobody is on the floor.", Verdict(False, "Nobody is on the floor")),
        (None, "Nobody is on the floor.", None),  # neither word: no verdict rather than a guess
        (None, "I cannot tell from these frames.", None),
        ({"answer": "maybe"}, "", None),
        (None, "[1, 2]", None),
    ],
)
def test_answers_are_parsed(fields: dict | None, text: str, expected: Verdict | None) -> None:
    assert parse_verdict(fields, text) == expected


def test_a_sustained_yes_is_one_alert_with_the_models_reason_then_it_clears_and_cools_down() -> None:
    rule = vlm_rule(cadence_s=5, for_s=10, clear_s=5, cooldown_s=60, snapshot=True)
    checks = VlmChecks([rule])
    assert checks.due(0.0) is rule
    checks.ask(rule, 0.0)
    assert checks.due(4.9) is None and checks.due(5.0) is rule

    def answer(t: float, yes: bool, reason: str = "someone lies on the floor"):
        return checks.verdict(rule, Moment(t, t + 100), Verdict(yes, reason), model="qwen")

    assert answer(0.0, True) is None
    assert answer(5.0, True) is None  # held 5 s of 10
    start = answer(10.0, True)
    assert start is not None and start.kind is AlertEventKind.START
    assert start.rule_type == "vlm" and start.severity == rule.severity and start.snapshot
    assert start.evidence["reason"] == "someone lies on the floor"
    assert start.evidence["question"] == rule.question and start.evidence["model"] == "qwen"
    assert start.evidence["held_s"] == 10.0
    assert answer(15.0, True) is None  # still the same alert
    assert answer(20.0, False) is None  # one "no" rides over
    end = answer(25.0, False)
    assert end is not None and end.kind is AlertEventKind.END and end.alert_id == start.alert_id
    assert end.evidence["question"] == rule.question and end.ended_pts == 120.0
    for t in (30.0, 35.0, 40.0, 45.0):
        assert answer(t, True) is None  # cooling down
    assert checks.suppressed == 1
    assert checks.verdict(rule, Moment(50.0, 150.0), None, model="qwen") is None
    assert checks.unanswered == 1


def test_the_stream_stopping_ends_an_open_alert() -> None:
    rule = vlm_rule(for_s=0)
    checks = VlmChecks([rule])
    start = checks.verdict(rule, Moment(1.0, 1.0), Verdict(True, "yes"), model="m")
    assert start is not None and checks.active == 1
    (end,) = checks.finish(Moment(3.0, 3.0))
    assert end.kind is AlertEventKind.END and end.evidence["reason"] == "stream_stopped"


def test_the_longest_overdue_question_goes_first() -> None:
    a, b = vlm_rule(cadence_s=5), VlmRule.model_validate({**vlm_rule().model_dump(), "id": "b", "cadence_s": 20})
    checks = VlmChecks([a, b])
    first = checks.due(0.0)
    assert first is a
    checks.ask(a, 0.0)
    assert checks.due(0.0) is b
    checks.ask(b, 0.0)
    assert checks.due(5.0) is a


def test_an_alert_across_a_media_time_restart_ends_after_it_started() -> None:
    # A camera reconnects while the alert is open: pts start again near 0, the stream clock goes on.
    rule = vlm_rule(cadence_s=1, for_s=0, clear_s=2)
    checks = VlmChecks([rule])
    start = checks.verdict(rule, Moment(54.2, 54.2), Verdict(True, "yes"), model="m")
    assert start is not None and start.started_pts == 54.2
    assert checks.verdict(rule, Moment(55.2, 55.2), Verdict(True, "yes"), model="m") is None
    assert checks.verdict(rule, Moment(60.0, 0.0), Verdict(False, "no"), model="m") is None  # reconnected
    end = checks.verdict(rule, Moment(62.0, 2.0), Verdict(False, "no"), model="m")
    assert end is not None and end.kind is AlertEventKind.END and end.pts == 2.0
    assert end.duration_s == 5.8 and end.ended_pts == pytest.approx(60.0)  # 54.2 + 5.8, not 0.0
    # Ended by the stream stopping after a restart: the same.
    start = checks.verdict(rule, Moment(200.0, 100.0), Verdict(True, "yes"), model="m")
    assert start is not None
    (end,) = checks.finish(Moment(203.0, 0.5))
    assert end.ended_pts == pytest.approx(103.0) and end.duration_s == 3.0
