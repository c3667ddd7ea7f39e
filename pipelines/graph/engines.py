"""The engines every stream shares, in one bundle: a new engine is one more field, not one more
constructor argument threaded through every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.batching import ModelBatcher
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
        """Named checks of the shared engines (for readiness): each batcher serves, and none of its
        model calls has run past its stuck deadline (`<name>_responsive`)."""
        batchers: dict[str, ModelBatcher[Any, Any]] = {"detector": self.detector}
        if self.captions is not None:
            batchers["asr"] = self.captions.batcher
        checks: dict[str, bool] = {}
        for name, batcher in batchers.items():
            checks[name] = batcher.alive
            checks[f"{name}_responsive"] = not batcher.stuck
        return checks
