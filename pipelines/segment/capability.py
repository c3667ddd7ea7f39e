"""Segmentation as a capability: the segmenter every stream shares (SAM-family or YOLO-seg), the
`segmentation:` section, and the segment stage that puts masks on tracked objects."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from engines.errors import EngineError
from pipelines.capability import NO_BUDGET, Capability, CapabilityError, OpenContext
from pipelines.segment import stage
from pipelines.segment.config import SegmentationSettings
from pipelines.segment.engine import SEGMENTATION, SEGMENTER, SegmentEngine, segmenter_claim

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def open_segmentation(
    settings: SegmentationSettings, context: OpenContext = NO_BUDGET
) -> AsyncIterator[SegmentEngine | None]:
    """The segmenter every stream shares, for the duration; None when segmentation is off. A bad
    model or an unavailable backend is a CapabilityError naming the setting."""
    if not settings.enabled:
        yield None
        return
    from engines.segment import open_segmenter

    compute = context.compute
    try:
        segmenter = await asyncio.to_thread(
            open_segmenter,
            sam_encoder=settings.sam_encoder,
            sam_decoder=settings.sam_decoder,
            yolo_seg=settings.yolo_seg,
            backend=settings.backend,
            threads=settings.threads or (compute.cores if compute is not None else None),
        )
    except (EngineError, ValueError) as exc:
        raise CapabilityError(f"segmentation: {exc}") from exc
    if compute is not None and str(segmenter.backend).endswith("-cpu"):
        compute.add(SEGMENTER, segmenter_claim(settings.threads or compute.cores))
    else:
        compute = None
    engine = SegmentEngine(segmenter, settings.to_settings(), compute=compute)
    log.info("segmentation on", extra={"segmenter": engine.name})
    try:
        yield engine
    finally:
        await asyncio.to_thread(engine.close)


CAPABILITY: Capability[SegmentEngine, SegmentationSettings] = Capability(
    key=SEGMENTATION,
    section="segmentation",
    settings=SegmentationSettings,
    open=open_segmentation,
    build=stage.build,
    shares_cpu=lambda settings: settings.enabled and settings.backend in ("auto", "onnx-cpu"),
)
