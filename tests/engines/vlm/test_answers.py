"""Reading a model's answer as the JSON it was asked for, from servers that hold it to the schema and
servers that do not."""

from __future__ import annotations

import pytest

from engines.vlm.answers import read_fields
from engines.vlm.errors import VlmBadResponse

SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"enum": ["yes", "no"]}}}


@pytest.mark.parametrize(
    ("text", "values", "form"),
    [
        ('{"answer": "yes"}', {"answer": "yes"}, "json"),
        ('  \n{"answer": "no"}\n', {"answer": "no"}, "json"),
        ('```json\n{"answer": "yes"}\n```', {"answer": "yes"}, "extracted"),
        ('```\n{"answer": "no"}```', {"answer": "no"}, "extracted"),
        ('Here you go: {"answer": "yes"} Anything else?', {"answer": "yes"}, "extracted"),
        # A brace in the prose before the object, and a fence holding no JSON before one that does.
        ('Sets {like this} aside: {"answer": "no"}', {"answer": "no"}, "extracted"),
        ('```\nnot json\n```\n```json\n{"answer": "yes"}\n```', {"answer": "yes"}, "extracted"),
        ("Yes, someone is lying by the door.", None, "text"),
        ("", None, "text"),
    ],
)
def test_what_is_there_is_read(text: str, values: dict[str, str] | None, form: str) -> None:
    read = read_fields(text, SCHEMA, cut=False, max_tokens=40)
    assert (read.values, read.form) == (values, form)


@pytest.mark.parametrize(
    ("text", "cut", "message"),
    [
        ('{"answer": "ye', False, "not JSON"),
        ('{"answer": "yes"', True, "cut at max_tokens=40"),
        ('```json\n{"answer": "ye', True, "cut at max_tokens=40"),
        ('{"answer": "maybe"}', False, "does not fit the schema"),
        ('Here: {"answer": "maybe"}', False, "does not fit the schema"),
        ("[1, 2]", False, "not a JSON object"),
    ],
)
def test_broken_or_misfitting_json_is_a_bad_response(text: str, cut: bool, message: str) -> None:
    with pytest.raises(VlmBadResponse, match=message) as caught:
        read_fields(text, SCHEMA, cut=cut, max_tokens=40)
    assert caught.value.text == text


def test_prose_cut_at_max_tokens_is_kept() -> None:
    read = read_fields("A person walks across the lot towards the", SCHEMA, cut=True, max_tokens=40)
    assert read.values is None and read.form == "text"
