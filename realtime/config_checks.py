"""The config's rules checked against what this service can run: the detector's classes, and
whether a VLM is there for `vlm` rules. Used by `serve` for the config file and by the API for a
stream it is given, so both say the same, naming the rule's key."""

from __future__ import annotations

from collections.abc import Mapping

from pipelines.rules.engine import unknown_classes
from realtime.config import AnyStreamSettings, Config, describe_problems


def rule_class_problems(stream: AnyStreamSettings, names: Mapping[int, str]) -> list[dict[str, str]]:
    """One `{"field", "message"}` per rule of the stream that names a class the detector does
    not have (`rules.1.classes: rule 'door': class 'person' not among ...`); none when the
    model's class names are unknown."""
    if not names:
        return []
    problems = []
    for index, rule in enumerate(stream.rules):
        for message in unknown_classes([rule], names):
            key = "fall_class" if rule.type == "fall" else "classes"
            problems.append({"field": f"rules.{index}.{key}", "message": message})
    return problems


def config_class_problems(config: Config, names: Mapping[int, str]) -> str | None:
    """The config's rules checked against the detector's classes: None, or one line naming each
    rule that cannot run (`streams.0.rules.1.classes: ...`)."""
    problems = [
        {**problem, "field": f"streams.{index}.{problem['field']}"}
        for index, stream in enumerate(config.streams)
        for problem in rule_class_problems(stream, names)
    ]
    return describe_problems(problems) if problems else None


VLM_RULE_NEEDS_VLM = "a vlm rule needs a VLM: set vlm.endpoints (or --vlm-url)"


def vlm_rule_problems(stream: AnyStreamSettings, vlm_enabled: bool) -> list[dict[str, str]]:
    """One `{"field", "message"}` per `vlm` rule of the stream when there is no VLM to ask: such a
    rule could never fire."""
    if vlm_enabled:
        return []
    return [
        {"field": f"rules.{index}.type", "message": f"rule {rule.id!r}: {VLM_RULE_NEEDS_VLM}"}
        for index, rule in enumerate(stream.rules)
        if rule.type == "vlm"
    ]


def config_vlm_problems(config: Config, vlm_enabled: bool | None = None) -> str | None:
    """The config's `vlm` rules checked against whether a VLM is configured (by default: as its
    `vlm` section says): None, or one line."""
    if vlm_enabled is None:
        vlm_enabled = bool(config.section("vlm").enabled)
    problems = [
        {**problem, "field": f"streams.{index}.{problem['field']}"}
        for index, stream in enumerate(config.streams)
        for problem in vlm_rule_problems(stream, vlm_enabled)
    ]
    return describe_problems(problems) if problems else None
