"""Where stream graphs are assembled: the stages every stream gets, in order.

The frame loop (detect → track → rules) comes first; then each capability's stage, in the order
`pipelines.capabilities` lists them; then the audio meter, which takes and counts a stream's audio
when no capability did. A new capability adds nothing here.
"""

from __future__ import annotations

from pipelines import audio_meter, frame_loop
from pipelines.capabilities import CAPABILITIES
from pipelines.graph import StageFactory

DEFAULT_STAGES: tuple[StageFactory, ...] = (
    frame_loop.build,
    *(capability.build for capability in CAPABILITIES),
    audio_meter.build,  # when no stage took the audio: it is still taken and counted
)
