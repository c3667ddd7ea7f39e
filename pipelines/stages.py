"""Where stream graphs are assembled: the stages every stream gets, in order.

Adding a capability is one module with a `build(ctx) -> Stage | None` factory, plus one line here.
"""

from __future__ import annotations

from pipelines import audio_meter, frame_loop
from pipelines.graph import StageFactory

DEFAULT_STAGES: tuple[StageFactory, ...] = (
    frame_loop.build,
    audio_meter.build,
)
