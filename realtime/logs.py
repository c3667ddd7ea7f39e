"""Structured logs: one line per record, `key=value` fields (or JSON with VIDSENTRY_LOG_JSON=1).

Fields passed through `extra=` become fields of the line. Payloads, transcripts and
credentials never go into info-level logs; URLs are logged in their redacted form.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [f"{stamp}.{int(record.msecs):03d}Z", record.levelname.lower(), record.name]
        parts.append(repr(record.getMessage()))
        for key, value in _fields(record).items():
            quoted = isinstance(value, str) and " " in value
            parts.append(f"{key}={value!r}" if quoted else f"{key}={value}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
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
