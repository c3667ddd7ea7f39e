"""Where alert snapshots go. `realtime` implements it (a NATS object store bucket)."""

from __future__ import annotations

from typing import Protocol


class SnapshotStore(Protocol):
    async def put(self, key: str, jpeg: bytes) -> str:
        """Store one JPEG; return the reference to put in the alert event."""
        ...
