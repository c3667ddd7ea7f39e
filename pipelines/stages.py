"""Where stream graphs are assembled: the stages every stream gets, in order.

The frame loop (detect → track → rules) comes first; then each capability's stage, in the order
`pipelines.capabilities` lists them; then the audio meter, which takes and counts a stream's audio
when no capability did. A new capability adds nothing here: the list is read from the registry
whenever a graph is built.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from pipelines import audio_meter, frame_loop
from pipelines.capabilities import CAPABILITIES
from pipelines.graph import StageFactory


class _DefaultStages(Sequence[StageFactory]):
    def _all(self) -> tuple[StageFactory, ...]:
        return (
            frame_loop.build,
            *(capability.build for capability in CAPABILITIES),
            audio_meter.build,  # when no stage took the audio: it is still taken and counted
        )

    @overload
    def __getitem__(self, index: int) -> StageFactory: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[StageFactory]: ...

    def __getitem__(self, index: int | slice) -> StageFactory | Sequence[StageFactory]:
        return self._all()[index]

    def __iter__(self) -> Iterator[StageFactory]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


DEFAULT_STAGES: Sequence[StageFactory] = _DefaultStages()
