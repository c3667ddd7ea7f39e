"""The CloudEvents binary-mode encoding, without a broker."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import numpy as np
import pytest

from pipelines.events import Event, EventKind
from pipelines.frames import InvalidStreamId
from realtime.bus.cloudevents import (
    EventEncodingError,
    decode,
    encode,
    parse_rfc3339,
    rfc3339,
    subject_for,
)
from tests.support.bodies import any_event

CAPTURED = 1_777_777_777.123456  # 2026-05-03T03:09:37.123Z
PUBLISHED = CAPTURED + 0.25


def make_event(kind: EventKind = EventKind.TRACKS, stream_id: str = "cam-1_a", **data: object) -> Event:
    return any_event(kind, stream_id, dict(data) or {"n": 1}, pts=12.5, captured_at=CAPTURED)


def test_rfc3339_is_utc_with_milliseconds_and_z() -> None:
    assert rfc3339(CAPTURED) == "2026-05-03T03:09:37.123Z"
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert parse_rfc3339(rfc3339(CAPTURED)) == datetime(2026, 5, 3, 3, 9, 37, 123000, tzinfo=UTC)
    with pytest.raises(EventEncodingError):
        rfc3339(math.nan)


@pytest.mark.parametrize("kind", list(EventKind))
def test_headers_for_every_kind(kind: EventKind) -> None:
    event = make_event(kind)
    _, headers = encode(event, "node-7", PUBLISHED)
    assert headers == {
        "ce-specversion": "1.0",
        "ce-id": event.id,
        "ce-source": "/vidsentry/node-7/cam-1_a",
        "ce-type": f"io.vidsentry.{kind.value}.v1",
        "ce-time": "2026-05-03T03:09:37.123Z",
        "content-type": "application/json",
        "Nats-Msg-Id": event.id,
    }
    assert subject_for(event) == f"vidsentry.cam-1_a.{kind.value}"


def test_body_carries_data_and_envelope_fields_compactly() -> None:
    payload, _ = encode(make_event(label="person", caption="héllo"), "n", PUBLISHED)
    assert b" " not in payload.replace("héllo".encode(), b"")  # compact separators
    body = json.loads(payload)
    assert body == {
        "label": "person",
        "caption": "héllo",
        "stream_id": "cam-1_a",
        "pts": 12.5,
        "captured_at": "2026-05-03T03:09:37.123Z",
        "published_at": "2026-05-03T03:09:37.373Z",
    }


def test_pts_none_is_null() -> None:
    event = any_event(EventKind.STATUS, "cam1", {"state": "live"}, pts=None, captured_at=CAPTURED)
    assert json.loads(encode(event, "n", PUBLISHED)[0])["pts"] is None


def test_numpy_values_become_plain_json() -> None:
    boxes = np.array([[0.1, 2.5, 30.25, 40.0]], dtype=np.float32)
    payload, _ = encode(
        make_event(
            boxes=boxes,
            scores=np.array([0.9], np.float32),
            ids=np.array([3], np.int32),
            score=np.float32(0.1),
            count=np.int64(2),
            flag=np.bool_(True),
        ),
        "n",
        PUBLISHED,
    )
    body = json.loads(payload)
    assert body["boxes"] == [[0.1, 2.5, 30.25, 40.0]]  # float32 kept short, not 0.10000000149
    assert body["scores"] == [0.9]
    assert body["ids"] == [3]
    assert body["score"] == 0.1
    assert body["count"] == 2
    assert body["flag"] is True


@pytest.mark.parametrize(
    "data",
    [{"score": math.nan}, {"score": np.float32("nan")}, {"boxes": np.array([math.inf])}, {"x": object()}],
    ids=["nan", "np-nan", "inf-array", "object"],
)
def test_values_json_cannot_carry_are_rejected(data: dict[str, object]) -> None:
    with pytest.raises(EventEncodingError, match="not JSON-serialisable"):
        encode(any_event(EventKind.TRACKS, "cam1", data, captured_at=CAPTURED), "n", PUBLISHED)


def test_nan_pts_rejected() -> None:
    event = any_event(EventKind.TRACKS, "cam1", pts=math.nan, captured_at=CAPTURED)
    with pytest.raises(EventEncodingError, match="pts"):
        encode(event, "n", PUBLISHED)


@pytest.mark.parametrize("stream_id", ["", "a.b", "cam 1", "cam>", "x" * 65, "kamera-ü"])
def test_invalid_stream_id_rejected_with_clear_error(stream_id: str) -> None:
    event = make_event(stream_id=stream_id)
    with pytest.raises(InvalidStreamId, match="invalid stream id"):
        subject_for(event)
    with pytest.raises(InvalidStreamId):
        encode(event, "n", PUBLISHED)


def test_envelope_fields_in_data_rejected() -> None:
    with pytest.raises(EventEncodingError, match="envelope fields"):
        encode(make_event(stream_id="cam1", captured_at="yesterday"), "n", PUBLISHED)


def test_bad_event_id_rejected() -> None:
    event = any_event(EventKind.TRACKS, "cam1", captured_at=CAPTURED, id="has space\r\n")
    with pytest.raises(EventEncodingError, match="event id"):
        encode(event, "n", PUBLISHED)


def test_odd_node_name_is_percent_encoded_and_decoded() -> None:
    payload, headers = encode(make_event(), "my node/1", PUBLISHED)
    assert headers["ce-source"] == "/vidsentry/my%20node%2F1/cam-1_a"
    decoded = decode(headers, payload)
    assert decoded["headers"]["ce-source"] == "/vidsentry/my node/1/cam-1_a"


def test_decode_roundtrip_keeps_ce_headers_and_body() -> None:
    event = make_event(label="person")
    payload, headers = encode(event, "n", PUBLISHED)
    decoded = decode(headers, payload)
    assert set(decoded["headers"]) == {
        "ce-specversion",
        "ce-id",
        "ce-source",
        "ce-type",
        "ce-time",
        "content-type",
    }
    assert decoded["headers"]["ce-id"] == event.id
    assert decoded["data"]["label"] == "person"


def test_decode_tolerates_foreign_messages() -> None:
    assert decode(None, b"not json") == {"headers": {}, "data": "not json"}
    assert decode({"Foo": "bar"}, b"") == {"headers": {}, "data": None}
