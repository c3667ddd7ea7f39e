"""The config's rules checked against what this service can run: the detector's classes, and
whether the capability that answers a rule type of its own (the describer's `vlm` questions) is
on; and the settings a stream gives a capability of its own (`captions: {model: base}`) checked
by that capability against its open engine. Used by `serve` for the config file and by the API for
a stream it is given, so both say the same, naming the key. What a rule needs is its type's
declaration, and what a stream's own settings need its capability's check, so nothing here names
one."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

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


def own_settings_problems(
    streams: Sequence[AnyStreamSettings], opened: Mapping[str, object]
) -> list[tuple[int, dict[str, str]]]:
    """The settings these streams give capabilities of their own, checked together by each
    capability against its open engine (`opened`, by name): the stream's index and a `{"field",
    "message"}` (the field its switch's key) per problem."""
    problems = []
    for capability in CAPABILITIES:
        switch = capability.switch
        if switch is None or switch.settings is None:
            continue
        own = [stream.stage_settings().get(switch.name) for stream in streams]
        if not any(own):
            continue
        for index, reason in capability.stream_problems(opened.get(capability.name), own):
            problems.append((index, {"field": switch.name, "message": reason}))
    return problems


def config_own_settings_problems(config: Config, opened: Mapping[str, object]) -> str | None:
    """The config's streams' own settings checked against the open engines: None, or one line
    (`streams.1.captions: ...`)."""
    problems = [
        {**problem, "field": f"streams.{index}.{problem['field']}"}
        for index, problem in own_settings_problems(config.streams, opened)
    ]
    return describe_problems(problems) if problems else None
