"""Where stream graphs are assembled: the stages every stream gets, in order.

Adding a capability is one module with a `build(ctx) -> Stage | None` factory, plus one line here.
"""

from __future__ import annotations

from pipelines import audio_meter, frame_loop
from pipelines.captions import stage as captions
from pipelines.describe import stage as describe
from pipelines.graph import StageFactory
from pipelines.segment import stage as segment

DEFAULT_STAGES: tuple[StageFactory, ...] = (
    frame_loop.build,
    captions.build,  # when the service has a speech recognizer and the stream wants captions
    audio_meter.build,  # otherwise: audio is still taken and counted
    describe.build,  # when the service has a VLM: descriptions and the stream's vlm rules
    segment.build,  # when the service has a segmenter: masks on the tracked objects
)
