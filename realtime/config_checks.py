"""The config's rules checked against what this service can run: the detector's classes, and
whether the capability that answers a rule type of its own (the describer's `vlm` questions) is
on. Used by `serve` for the config file and by the API for a stream it is given, so both say the
same, naming the rule's key. What a rule needs is its type's declaration, so nothing here names
one."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from pipelines.capabilities import CAPABILITIES, rule_owner
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
            key = rule.class_key or "type"
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


def rule_need_problems(stream: AnyStreamSettings, on: Collection[str]) -> list[dict[str, str]]:
    """One `{"field", "message"}` per rule of the stream whose type belongs to a capability that
    is not on (not in `on`, by name): such a rule could never fire."""
    problems = []
    for index, rule in enumerate(stream.rules):
        owner = rule_owner(type(rule))
        if owner is not None and owner.name not in on:
            problems.append({"field": f"rules.{index}.type", "message": f"rule {rule.id!r}: {rule.needs}"})
    return problems


def configured_on(config: Config) -> list[str]:
    """The capabilities on as the config's sections say (before anything is opened)."""
    return [c.name for c in CAPABILITIES if c.configured_on(config.section(c.section))]


def config_rule_problems(config: Config, on: Collection[str] | None = None) -> str | None:
    """The config's rules checked against the capabilities that answer them (by default: those on
    as its sections say): None, or one line."""
    on = configured_on(config) if on is None else on
    problems = [
        {**problem, "field": f"streams.{index}.{problem['field']}"}
        for index, stream in enumerate(config.streams)
        for problem in rule_need_problems(stream, on)
    ]
    return describe_problems(problems) if problems else None
