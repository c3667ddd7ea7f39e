"""A model's answer read as the JSON it was asked for, whether or not its server kept to the schema.

vLLM constrains the answer to the schema in `response_format`. Many servers users point us at do
not: older llama.cpp and Ollama builds, LM Studio with some models, proxies in front of a hosted
model. Those models still write JSON when told to, but wrap it in a code fence or a sentence, or
answer in plain prose. Throwing such answers away stopped descriptions and alert checks on those
servers; reading what is there keeps them going, and the form each answer came in is counted so an
operator can see which server does what.

Forms: `json` (the whole answer parses), `extracted` (a JSON object found inside a fence or prose),
`text` (no JSON at all: the caller gets the text and no fields). A reply that starts as JSON and
breaks off, or JSON that does not fit the schema, is still a bad answer: a model that was
constrained and failed, not one that was never asked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engines.vlm.errors import VlmBadResponse
from engines.vlm.schema import schema_problem

FORMS = ("json", "extracted", "text")
_FENCE_RE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Fields:
    values: Mapping[str, Any] | None  # None: the answer holds no JSON (form "text")
    form: str


def read_fields(text: str, schema: Mapping[str, Any], *, cut: bool, max_tokens: int) -> Fields:
    """The answer's fields for `schema`. Raises VlmBadResponse for broken or misfitting JSON.
    `cut`: the answer stopped at max_tokens."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        if cut:
            raise VlmBadResponse(f"the answer was cut at max_tokens={max_tokens} before its JSON ended", text=text)
        try:
            value = json.loads(stripped)
        except ValueError:
            raise VlmBadResponse(f"the model's answer is not JSON: {text[:80]!r}", text=text) from None
        return Fields(_fitting(value, schema, text), "json")
    found = _embedded_object(stripped)
    if found is not None:
        return Fields(_fitting(found, schema, text), "extracted")
    if cut and "```" in stripped:
        raise VlmBadResponse(f"the answer was cut at max_tokens={max_tokens} inside its JSON", text=text)
    return Fields(None, "text")


def _fitting(value: Any, schema: Mapping[str, Any], text: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise VlmBadResponse("the model's answer is not a JSON object", text=text)
    if (problem := schema_problem(value, schema)) is not None:
        raise VlmBadResponse(f"the model's answer does not fit the schema: {problem}", text=text)
    return value


def _embedded_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in a code fence, else the first one in the prose."""
    for match in _FENCE_RE.finditer(text):
        try:
            value = json.loads(match.group(1).strip())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None
