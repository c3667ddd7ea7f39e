"""A small check that a model's JSON fits the schema it was asked for.

vLLM's structured outputs normally guarantee it, but an answer cut at max_tokens, a server whose
grammar backend ignored the schema, or a proxy in between can still hand back something else.
Covers what answer schemas use (type, properties, required, additionalProperties, enum, items,
minimum/maximum, minLength/maxLength); anything else in the schema is not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def schema_problem(value: Any, schema: Mapping[str, Any], path: str = "$") -> str | None:
    """None when `value` fits `schema`, else what is wrong and where."""
    expected = schema.get("type")
    if expected is not None:
        names = [expected] if isinstance(expected, str) else list(expected)
        if not any(_is(value, name) for name in names):
            return f"{path}: expected {'/'.join(names)}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: {value!r} is not one of {schema['enum']!r}"
    if isinstance(value, dict):
        return _object_problem(value, schema, path)
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            if (problem := schema_problem(item, schema["items"], f"{path}[{index}]")) is not None:
                return problem
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: {value} is below the minimum {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: {value} is above the maximum {schema['maximum']}"
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{path}: longer than {schema['maxLength']} characters"
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{path}: shorter than {schema['minLength']} characters"
    return None


def _object_problem(value: dict[str, Any], schema: Mapping[str, Any], path: str) -> str | None:
    properties = schema.get("properties") or {}
    missing = [key for key in schema.get("required") or () if key not in value]
    if missing:
        return f"{path}: missing {', '.join(missing)}"
    if schema.get("additionalProperties") is False:
        extra = [key for key in value if key not in properties]
        if extra:
            return f"{path}: unexpected {', '.join(extra)}"
    for key, sub in properties.items():
        if key in value and isinstance(sub, Mapping) and (problem := schema_problem(value[key], sub, f"{path}.{key}")):
            return problem
    return None


def _is(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(name, object))
