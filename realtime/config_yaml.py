"""Reading a config file so that no file can cost more than a config should, before anything is built.

The file is bounded twice. MAX_CONFIG_BYTES bounds the text; MAX_CONFIG_VALUES bounds what it
expands to: YAML aliases (`*name`) reuse a value by reference, and pydantic validates each use
as a copy, so a 12 KB file that reuses a stream of 64 zone polygons a thousand times costs
gigabytes. So the loader first reads the document's events only (no tags resolved, nothing
built: a tenth of the cost of composing it), counts the values it expands to (each alias use as a
copy, each anchor's size remembered), checks the numbers, and names the innermost key that expands
past the bound; only a document that passes is built. The same pass counts `streams` and reads
`http.max_streams`, so too many streams are refused before any is built or validated (100,000 of
them took 23 s and 600 MB only to be refused).

Numbers no setting could hold are refused here too: an integer literal of more than MAX_INT_DIGITS
digits (Python refuses to convert 4,300 and more, and a long one costs quadratic time) and a float
literal that underflows to zero (`for_s: 1e-400` is not 0; one that overflows is infinite, which
every setting refuses).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from realtime.errors import ServiceError

# A config is a few KiB; the cap keeps `--config /dev/zero` or a wrong huge file from eating memory.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# What a config may expand to, YAML aliases counted once per use (mappings, lists and scalars, keys
# included). A real config holds a few hundred; one with 64 streams of 64 rules, each with a
# 64-point zone, about 800,000. Validating this many takes about a second.
MAX_CONFIG_VALUES = 1_000_000
# No setting holds an integer this long (the largest bounds are below 10**13); Python refuses to
# convert 4,300 digits and more, and converting a long one costs quadratic time.
MAX_INT_DIGITS = 18
MAX_PROBLEM_CHARS = 300  # of one problem's field or message (a key or value may be megabytes)


class ConfigError(ServiceError, ValueError):
    """A config that cannot be used; the message names the file and the key."""


def clip(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    """`text` on one line, cut to `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# libyaml when PyYAML has it: ten times faster on a large file, and it bounds nesting (1,000 levels).
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# A plain scalar that reads as a decimal number, to YAML (`1.5`, `12`) or to pydantic (`1e-400`).
_PLAIN_NUMBER = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?\Z")


class YamlProblem(ServiceError, ValueError):
    """A YAML document that cannot be a config, found before it is built; names the key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key or '(top level)'}: {message}")


def integer_problem(text: str) -> str | None:
    """Why an integer literal is out of range for every setting, or None."""
    digits = sum(ch.isalnum() for ch in text)
    if digits > MAX_INT_DIGITS:
        return f"an integer of {digits} digits is out of range (at most {MAX_INT_DIGITS} digits)"
    return None


def float_problem(text: str, value: float) -> str | None:
    """Why a float literal cannot be read as the number it says (it underflows to 0), or None.
    One that overflows is infinite, which every setting refuses by name (allow_inf_nan)."""
    mantissa = text.lower().split("e")[0]
    if value == 0.0 and any(ch in "123456789" for ch in mantissa):
        return f"{clip(text, 40)} is too small for a number (it would be read as 0)"
    return None


_HEX_OCT_BIN = re.compile(r"[-+]?0(?:x[0-9a-fA-F_]+|b[01_]+|[0-7_]+)\Z")


@dataclasses.dataclass(slots=True)
class _Open:
    """A mapping or list being read: its key, what it holds so far, and where the next value goes."""

    key: str
    anchor: str | None
    mapping: bool
    values: int = 0  # expanded, its own values and everything under them
    items: int = 0  # direct items (a mapping counts keys and values)
    label: str = "?"  # a mapping's last key, naming the value that follows it

    def child_key(self) -> str:
        # In a mapping a value is named by its key; a key itself (an even item) is "?".
        name = str(self.items) if not self.mapping else self.label if self.items % 2 else "?"
        return f"{self.key}.{name}" if self.key else name


@dataclasses.dataclass(slots=True)
class YamlShape:
    """What check_yaml_events found: the values the document expands to, and the raw
    `streams` length and `http.max_streams` text, to refuse too many streams before any is built."""

    values: int
    streams: int | None
    max_streams: str | None


def check_yaml_events(text: str, max_values: int = MAX_CONFIG_VALUES) -> YamlShape:
    """Reads the document's events (no tags resolved, no nodes or values built: the cheap part of
    YAML, a tenth of the composing) and counts the values it expands to, each use of an alias as a
    copy. YamlProblem names the smallest key that expands past `max_values`, an alias that
    contains itself, or a number no setting can hold; yaml.YAMLError a document that is no YAML."""
    loader = _YAML_LOADER(text)
    stack: list[_Open] = []
    anchors: dict[str, int] = {}
    open_anchors: set[str] = set()
    shape = YamlShape(values=0, streams=None, max_streams=None)
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.ScalarEvent | yaml.AliasEvent):
                key = stack[-1].child_key() if stack else ""
                if isinstance(event, yaml.AliasEvent):
                    if event.anchor in open_anchors:
                        raise YamlProblem(key, "a YAML alias refers to a value that contains it")
                    size = anchors.get(event.anchor or "", 1)  # an unknown anchor: the composer says so
                else:
                    _check_scalar(event, key)
                    if key == "http.max_streams":
                        shape.max_streams = event.value
                    size = 1
                    if stack and stack[-1].mapping and stack[-1].items % 2 == 0:
                        stack[-1].label = clip(event.value, 64)
                if event.anchor is not None and isinstance(event, yaml.ScalarEvent):
                    anchors[event.anchor] = 1
                _add(stack, size, max_values, shape)
            elif isinstance(event, yaml.CollectionStartEvent):
                key = stack[-1].child_key() if stack else ""
                stack.append(_Open(key, event.anchor, isinstance(event, yaml.MappingStartEvent)))
                if event.anchor is not None:
                    open_anchors.add(event.anchor)
            elif isinstance(event, yaml.CollectionEndEvent):
                done = stack.pop()
                if done.key == "streams" and not done.mapping:
                    shape.streams = done.items
                if done.anchor is not None:
                    open_anchors.discard(done.anchor)
                    anchors[done.anchor] = 1 + done.values
                _add(stack, 1 + done.values, max_values, shape)
    finally:
        loader.dispose()
    return shape


def _add(stack: list[_Open], size: int, max_values: int, shape: YamlShape) -> None:
    if not stack:
        shape.values = size
        return
    parent = stack[-1]
    parent.values += size
    parent.items += 1
    if parent.values >= max_values:  # +1 for the parent itself: past the bound, named where it happens
        raise YamlProblem(
            parent.key,
            f"expands to more than {max_values:,} values (each use of a YAML alias counts as a copy); "
            "a config holds far fewer",
        )


def _check_scalar(event: yaml.ScalarEvent, key: str) -> None:
    value, tag = event.value, event.tag
    plain = event.implicit[0] and not event.style  # no tag, no quotes: YAML or pydantic reads a number
    problem = None
    if tag == _INT_TAG or (plain and _HEX_OCT_BIN.match(value)):
        problem = integer_problem(value)
    elif tag == _FLOAT_TAG or (plain and _PLAIN_NUMBER.match(value)):
        try:
            number = float(value.replace("_", ""))
        except ValueError:
            return  # `.inf`, `1:30.5`: pydantic judges those
        problem = float_problem(value, number)
        if problem is None and not any(ch in value for ch in ".eE"):
            problem = integer_problem(value)
    if problem is not None:
        raise YamlProblem(key, problem)


def parse_yaml(text: str, check: Callable[[YamlShape], None] | None = None) -> tuple[Any, YamlShape]:
    """The document's value and shape, built only after check_yaml_events (and `check`, given the
    shape) passed; YamlProblem or yaml.YAMLError (with a mark) when it cannot be a config."""
    shape = check_yaml_events(text)
    if check is not None:
        check(shape)
    loader = _YAML_LOADER(text)
    try:
        return loader.get_single_data(), shape
    finally:
        loader.dispose()


def read_config_text(path: str | Path) -> str:
    """The file's text: a regular file of at most MAX_CONFIG_BYTES in UTF-8, else ConfigError."""
    try:
        # Non-blocking, so that a FIFO is refused below instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{path}: not a regular file")
    with open(fd, "rb") as file:
        try:
            data = file.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB, too large for a config")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
