"""Names of the fleet's buckets and keys, and the small JSON records kept in them."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from realtime.errors import ServiceError

FLEET_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
LEASE_PREFIX = "lease."
NODE_PREFIX = "node."
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class InvalidFleetName(ServiceError, ValueError):
    pass


def check_fleet_name(name: str) -> str:
    if not FLEET_NAME.fullmatch(name):
        raise InvalidFleetName("a fleet name is 1-32 characters from A-Z a-z 0-9 _ -")
    return name


def desired_bucket(fleet: str) -> str:
    """Bucket of the desired set: one key per stream id, the stream object as JSON."""
    return f"vidsentry-fleet-{fleet}"


def lease_bucket(fleet: str) -> str:
    """Bucket of leases and node records; its max age is the lease TTL."""
    return f"vidsentry-fleet-{fleet}-leases"


def lease_key(stream_id: str) -> str:
    return LEASE_PREFIX + stream_id  # stream ids are valid key tokens already


def node_key(node: str) -> str:
    # Host names may hold dots (key token separators) or other characters keys refuse.
    return NODE_PREFIX + _KEY_UNSAFE.sub("_", node)[:128]


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    node: str
    stream_id: str

    def encode(self) -> bytes:
        return json.dumps({"node": self.node, "stream_id": self.stream_id}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> LeaseRecord | None:
        body = _object(raw)
        node, stream_id = body.get("node"), body.get("stream_id")
        if isinstance(node, str) and isinstance(stream_id, str):
            return cls(node, stream_id)
        return None


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What a worker tells the others each renewal: its load and its streams' states."""

    node: str
    capacity: int
    draining: bool = False
    states: dict[str, str] = field(default_factory=dict)  # stream id -> state, for the others' listings
    instance: str = ""  # this run of the worker (random per process): tells two workers of one name apart

    @property
    def streams(self) -> int:
        return len(self.states)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> NodeRecord | None:
        body = _object(raw)
        node, capacity, states = body.get("node"), body.get("capacity"), body.get("states")
        if not isinstance(node, str) or not isinstance(capacity, int) or not isinstance(states, dict):
            return None
        clean = {str(k): str(v) for k, v in states.items()}
        instance = body.get("instance")
        return cls(node, capacity, bool(body.get("draining", False)), clean,
                   instance if isinstance(instance, str) else "")


def _object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
