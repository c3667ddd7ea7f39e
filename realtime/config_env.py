"""Settings from the environment: `VIDSENTRY_` variables override the file.

Nested keys are joined by `__` (for example `VIDSENTRY_NATS__URL=nats://bus:4222`,
`VIDSENTRY_DETECTOR__CONF=0.4`). A value is read as the setting's type: a string setting (a token,
a host, a path) takes the value as it is, never parsed; a number or a switch is converted by
pydantic (`0.4`, `true`); a list or a section is YAML. Errors name the variable, never its value
(it may be a secret).
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, SecretStr

from realtime.config_yaml import ConfigError, YamlProblem, parse_yaml

ENV_PREFIX = "VIDSENTRY_"
# Read by the CLI itself, not settings in the file.
ENV_NOT_SETTINGS = frozenset({"VIDSENTRY_LOG_LEVEL", "VIDSENTRY_LOG_JSON", "VIDSENTRY_API_TOKEN"})


def _members(annotation: Any) -> list[Any]:
    """The types a field accepts: Annotated metadata and None dropped, unions flattened."""
    if typing.get_origin(annotation) is Annotated:
        return _members(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    return [] if annotation is type(None) else [annotation]


def _is_model(member: Any) -> bool:
    return isinstance(member, type) and issubclass(member, BaseModel)


def _is_text(member: Any) -> bool:
    if typing.get_origin(member) is Literal:
        return all(isinstance(v, str) for v in typing.get_args(member))
    return isinstance(member, type) and issubclass(member, str | SecretStr | os.PathLike)


def _env_kind(model: type[BaseModel], path: list[str]) -> str:
    """How an environment value for the setting at `path` of `model` is read: "text" (as it is),
    "scalar" (a string pydantic converts: numbers, switches), or "yaml" (lists and whole sections)."""
    members: list[Any] = [model]
    for part in path:
        models = [m for m in members if _is_model(m)]
        field = next((m.model_fields[part] for m in models if part in m.model_fields), None)
        if field is None:
            return "text"  # no such key: pydantic reports it as unknown, naming it
        members = _members(field.annotation)
    if any(_is_model(m) or typing.get_origin(m) in (list, tuple, dict, set) for m in members):
        return "yaml"
    return "text" if members and all(_is_text(m) for m in members) else "scalar"


def env_overrides(model: type[BaseModel], environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings of `model` the environment sets, as a tree to merge over the file, and which
    variable set each (by dotted key, for error messages)."""
    tree: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_SETTINGS:
            continue
        path = name[len(ENV_PREFIX):].lower().split("__")
        if _env_kind(model, path) == "yaml":
            try:
                parsed, _shape = parse_yaml(value)
            except YamlProblem as exc:
                raise ConfigError(f"environment: {name}: {exc}") from None  # names a key, never a value
            except (yaml.YAMLError, ValueError, TypeError, RecursionError):
                raise ConfigError(f"environment: {name}: not valid YAML") from None  # the value may be secret
        else:
            parsed = value  # never YAML: `null`, `~`, `abc #x`, `!tok` or `::` are what they say
        node = tree
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment: {name}: {'.'.join(path[:-1])} is set by another variable too")
            node = child
        node[path[-1]] = parsed
        sources[".".join(path)] = name
    return tree, sources


def name_variables(problems: list[dict[str, str]], sources: Mapping[str, str]) -> list[dict[str, str]]:
    """`http.port` becomes `http.port (VIDSENTRY_HTTP__PORT)` when the environment set it."""
    named = []
    for problem in problems:
        field = problem["field"]
        variable = next((v for key, v in sources.items() if field == key or field.startswith(key + ".")), None)
        named.append({**problem, "field": f"{field} ({variable})"} if variable else problem)
    return named


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged
