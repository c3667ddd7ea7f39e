"""CloudEvents 1.0 binary mode over NATS: `ce-*` headers, plain JSON body.

The CloudEvents Python SDK has no NATS binding; this is the small subset we need
(binding spec 1.0.3-wip: every attribute becomes a `ce-<name>` header, values percent-encoded).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

import numpy as np

from pipelines.events import Event, EventKind
from pipelines.frames import validate_stream_id
from realtime.errors import ServiceError

SPEC_VERSION = "1.0"
SUBJECT_PREFIX = "vidsentry"
CONTENT_TYPE = "application/json"
MSG_ID_HEADER = "Nats-Msg-Id"  # JetStream drops a second message with the same id inside the window
ENVELOPE_FIELDS = ("stream_id", "pts", "captured_at", "published_at")
LEASE_HEADER = "ce-leaserev"  # the same value as a CloudEvents extension attribute
# Printable ASCII without spaces: ids travel in headers and in JetStream's dedup table.
_EVENT_ID_PATTERN = re.compile(r"[!-~]{1,256}")


class EventEncodingError(ServiceError, ValueError):
    """The event cannot be put on the wire (bad id, NaN, a value JSON cannot carry, ...)."""


def subject_for(event: Event) -> str:
    """`vidsentry.<stream_id>.<kind>`; raises InvalidStreamId for ids outside [A-Za-z0-9_-]{1,64}."""
    return subject(event.stream_id, EventKind(event.kind))


def subject(stream_id: str, kind: EventKind | str) -> str:
    validate_stream_id(stream_id)
    return f"{SUBJECT_PREFIX}.{stream_id}.{EventKind(kind).value}"


def ce_type(kind: EventKind | str) -> str:
    return f"io.vidsentry.{EventKind(kind).value}.v1"


def ce_source(node: str, stream_id: str) -> str:
    # A hostname is normally URI-safe already; quote so an odd one cannot break the URI reference.
    return f"/vidsentry/{quote(node, safe='-._~')}/{stream_id}"


def rfc3339(ts: float) -> str:
    """Epoch seconds as RFC 3339 UTC with millisecond precision, e.g. `2026-05-01T12:00:00.123Z`."""
    if not math.isfinite(ts):
        raise EventEncodingError(f"timestamp must be finite, got {ts!r}")
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(text: str) -> datetime:
    """Inverse of rfc3339 (accepts any offset); for consumers and tests."""
    return datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))


def encode(event: Event, node: str, published_at: float) -> tuple[bytes, dict[str, str]]:
    """Body and headers for one event. `ce-time` is the occurrence time (captured_at)."""
    stream_id = validate_stream_id(event.stream_id)
    kind = EventKind(event.kind)
    if not isinstance(event.id, str) or not _EVENT_ID_PATTERN.fullmatch(event.id):
        raise EventEncodingError(f"event id must be 1-256 printable ASCII characters without spaces: {event.id!r}")
    body: dict[str, Any] = event.data  # the JSON object, made here once
    clash = [name for name in ENVELOPE_FIELDS if name in body]
    if clash:
        raise EventEncodingError(f"{kind.value} event data must not set envelope fields {clash}")
    if event.pts is not None and not math.isfinite(event.pts):
        raise EventEncodingError(f"pts must be finite or None, got {event.pts!r}")

    captured = rfc3339(event.captured_at)
    body.update(
        stream_id=stream_id,
        pts=None if event.pts is None else float(event.pts),
        captured_at=captured,
        published_at=rfc3339(published_at),
    )
    try:
        payload = json.dumps(
            body, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_default
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise EventEncodingError(f"{kind.value} event {event.id} is not JSON-serialisable: {exc}") from exc

    headers = {
        "ce-specversion": SPEC_VERSION,
        "ce-id": event.id,
        "ce-source": ce_source(node, stream_id),
        "ce-type": ce_type(kind),
        "ce-time": captured,
        "content-type": CONTENT_TYPE,
        MSG_ID_HEADER: event.id,
    }
    if event.lease is not None:
        headers[LEASE_HEADER] = str(event.lease)  # a fleet-owned stream's fencing token (realtime.fleet)
    return payload, headers


def decode(headers: Mapping[str, str] | None, data: bytes) -> dict[str, Any]:
    """`{"headers": {ce-* and content-type, lower-cased, percent-decoded}, "data": body}`.

    The body is parsed as JSON when it is JSON; anything else comes back as text, so a
    subscriber never dies on a foreign message sharing the subject space.
    """
    out_headers: dict[str, str] = {}
    for key, value in (headers or {}).items():
        name = key.lower()
        if name.startswith("ce-"):
            out_headers[name] = unquote(value)
        elif name == "content-type":
            out_headers[name] = value
    text = data.decode("utf-8", errors="replace")
    body: Any
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = text
    return {"headers": out_headers, "data": body}


def _json_default(obj: object) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "f" and obj.dtype.itemsize < 8:
            # Via str: float32 0.1 becomes 0.1 on the wire, not 0.10000000149011612.
            return obj.astype(str).astype(np.float64).tolist()
        return obj.tolist()
    if isinstance(obj, np.floating) and obj.dtype.itemsize < 8:
        return float(str(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, datetime):
        if obj.tzinfo is None:
            raise TypeError("naive datetime (no timezone)")
        return obj.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")
