"""Structured logs: one line per record, `key=value` fields (or JSON with VIDSENTRY_LOG_JSON=1).

Fields passed through `extra=` become fields of the line. Payloads, transcripts and
credentials never go into info-level logs; URLs are logged in their redacted form.

A value may come from a client (a URL, a stream id in a path, a reason), so every value is
escaped: one containing a space, `=`, a quote, a backslash or anything unprintable is quoted
with `\n`, `\r`, `\t` and the rest escaped, and a traceback's lines are indented. No value
can end the line or start a forged one.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"', "\\": "\\\\"}
_NEEDS_QUOTES = frozenset(' ="\\')
_CONTINUATION = "\n  | "  # each further line of a traceback: never mistaken for a record


def quote(value: object, *, always: bool = False) -> str:
    """`value` as one token of a key=value line: bare when that is unambiguous, else in double
    quotes with quotes, backslashes and every unprintable character escaped."""
    text = str(value)
    if not always and text and text.isprintable() and not _NEEDS_QUOTES.intersection(text):
        return text
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif not ch.isprintable():
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _indented(text: str) -> str:
    # splitlines: also \r, \x0b, \x1c-\x1e, \x85, \u2028 and \u2029, which some readers take as line ends
    return _CONTINUATION.join(text.splitlines())


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [f"{stamp}.{int(record.msecs):03d}Z", record.levelname.lower(), record.name]
        parts.append(quote(record.getMessage(), always=True))
        for key, value in _fields(record).items():
            parts.append(f"{quote(key)}={quote(value)}")
        line = " ".join(parts)
        if record.exc_info:
            line += _CONTINUATION + _indented(self.formatException(record.exc_info))
        if record.stack_info:
            line += _CONTINUATION + _indented(self.formatStack(record.stack_info))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        body.update(_fields(record))
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


def setup_logging(level: str | None = None) -> None:
    level = (level or os.environ.get("VIDSENTRY_LOG_LEVEL") or "WARNING").upper()
    handler = logging.StreamHandler(sys.stderr)
    use_json = os.environ.get("VIDSENTRY_LOG_JSON") == "1"
    handler.setFormatter(JsonFormatter() if use_json else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # nats-py logs every reconnect attempt with a traceback; our publisher reports outages itself.
    logging.getLogger("nats").setLevel(max(logging.getLogger().level, logging.ERROR))
