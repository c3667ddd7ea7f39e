"""The `chimes` kind, declared by its body: durable (searchable), and every one counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pipelines.events import Delivery, EventBody, Findable, KindSpec


@dataclass(frozen=True, slots=True)
class ChimeBody(EventBody):
    spec: ClassVar[KindSpec] = KindSpec("chimes", durable=True, delivery=Delivery.EVERY)
    sound: str
    frame_seq: int

    def fields(self) -> dict[str, Any]:
        return {"sound": self.sound, "frame_seq": self.frame_seq}

    @classmethod
    def search(cls, data: Mapping[str, Any], *, stream_id: str, pts: float | None) -> Findable:
        return Findable(f"chime {data['sound']}", pts, pts, {"frame_seq": data.get("frame_seq")})
