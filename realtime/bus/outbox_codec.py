"""The outbox's on-disk record format: CRC-framed, length-prefixed event records.

A frame is magic, body length and CRC-32 of the body, then the body: a fixed head (seq,
enqueue time, severity, field lengths) followed by kind, event id, stream id, subject,
headers (JSON) and payload. A torn or corrupted frame fails its CRC and is skipped by
`scan`, which resumes at the next magic.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from pipelines.events import EventKind
from realtime.bus.delivery import WireMessage

_MAGIC = b"VSOB"
_FRAME = struct.Struct("<4sII")  # magic, body length, CRC-32 of the body
# seq, enqueued_at, severity code, then the lengths of kind, event id, stream id, subject, headers, payload
_BODY = struct.Struct("<QdBBHHHII")
SEQ = struct.Struct("<Q")
_MAX_BODY = 64 * 2**20
SEVERITY_CODE = {"info": 1, "warning": 2, "critical": 3}
_SEVERITY_NAME = {code: name for name, code in SEVERITY_CODE.items()}


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """One queued event, as read back from disk."""

    seq: int
    event_id: str
    stream_id: str
    kind: EventKind
    severity: str | None
    subject: str
    headers: dict[str, str]
    payload: bytes
    enqueued_at: float  # time.time() when it was appended

    def to_wire(self) -> WireMessage:
        # created_at is monotonic; rebuild it from the wall-clock age so delays stay meaningful.
        created = time.monotonic() - max(0.0, time.time() - self.enqueued_at)
        return WireMessage(self.event_id, self.kind, self.subject, self.payload, self.headers, created, self.severity)


def frame_record(body: bytes) -> bytes:
    return _FRAME.pack(_MAGIC, len(body), zlib.crc32(body)) + body


def frame_at(data: bytes, pos: int) -> bytes | None:
    """The body of an intact frame starting at pos, else None."""
    if len(data) - pos < _FRAME.size:
        return None
    magic, length, crc = _FRAME.unpack_from(data, pos)
    start = pos + _FRAME.size
    if magic != _MAGIC or length > _MAX_BODY or start + length > len(data):
        return None
    body = data[start : start + length]
    return body if zlib.crc32(body) == crc else None


def scan(data: bytes) -> Iterator[tuple[int, int, bytes | None]]:
    """(offset, size, body) per intact frame; (offset, size, None) per damaged stretch, after
    which scanning resumes at the next magic (a false magic inside a payload fails its CRC)."""
    pos = 0
    while pos < len(data):
        body = frame_at(data, pos)
        if body is not None:
            size = _FRAME.size + len(body)
            yield pos, size, body
            pos += size
            continue
        resume = data.find(_MAGIC, pos + 1)
        end = len(data) if resume < 0 else resume
        yield pos, end - pos, None
        pos = end


def encode(seq: int, enqueued_at: float, msg: WireMessage, severity: str | None) -> bytes:
    parts = [
        msg.kind.value.encode(),
        msg.event_id.encode(),
        msg.stream_id.encode(),
        msg.subject.encode(),
        json.dumps(msg.headers, separators=(",", ":")).encode(),
        msg.payload,
    ]
    head = _BODY.pack(seq, enqueued_at, SEVERITY_CODE.get(severity or "", 0), *map(len, parts))
    return b"".join([head, *parts])


def decode_head(body: bytes) -> tuple[int, float, str, str | None] | None:
    """seq, enqueued_at, kind, severity: what the index needs, without copying the payload."""
    if len(body) < _BODY.size:
        return None
    seq, enqueued_at, severity, *lengths = _BODY.unpack_from(body)
    if _BODY.size + sum(lengths) != len(body):
        return None
    kind = body[_BODY.size : _BODY.size + lengths[0]].decode("ascii", errors="replace")
    return seq, enqueued_at, kind, _SEVERITY_NAME.get(severity)


def decode(body: bytes) -> OutboxRecord | None:
    head = decode_head(body)
    if head is None:
        return None
    seq, enqueued_at, kind, severity = head
    _, _, _, *lengths = _BODY.unpack_from(body)
    fields: list[bytes] = []
    pos = _BODY.size
    for length in lengths:
        fields.append(body[pos : pos + length])
        pos += length
    try:
        headers = json.loads(fields[4])
        return OutboxRecord(
            seq=seq,
            event_id=fields[1].decode(),
            stream_id=fields[2].decode(),
            kind=EventKind(kind),
            severity=severity,
            subject=fields[3].decode(),
            headers={str(k): str(v) for k, v in headers.items()},
            payload=bytes(fields[5]),
            enqueued_at=enqueued_at,
        )
    except (ValueError, AttributeError):
        return None
