"""The engines every stream shares, in one bundle: a new engine is one more field, not one more
constructor argument threaded through every layer."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.captions.engine import CaptionEngine
from pipelines.describe.settings import DescribeEngine
from pipelines.detect import DetectionBatcher
from pipelines.rules.snapshots import SnapshotStore
from pipelines.segment.engine import SegmentEngine


@dataclass(frozen=True, slots=True)
class SharedEngines:
    detector: DetectionBatcher
    snapshots: SnapshotStore | None = None  # alert pictures; None: alerts carry `snapshot: null`
    captions: CaptionEngine | None = None  # the shared speech recognizer; None: no captions anywhere
    describe: DescribeEngine | None = None  # the shared VLM client; None: no descriptions anywhere
    segment: SegmentEngine | None = None  # the shared segmenter; None: no masks anywhere

    def health(self) -> dict[str, bool]:
        """Named liveness checks of the shared engines (for readiness)."""
        checks = {"detector": self.detector.alive}
        if self.captions is not None:
            checks["asr"] = self.captions.batcher.alive
        return checks
