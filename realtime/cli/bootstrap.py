"""What every command shares: its error type and exit codes, loading the detector, opening the bus.

Imported only once a command has been chosen, never to build `--help`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engines.asr.types import AsrUnavailable
from engines.asr.vad import VadModel
from engines.asr.whisper import create_recognizer
from engines.errors import EngineError, EngineUnavailable
from engines.models import ModelNotFound, default_detector_model
from engines.registry import create_detector
from engines.vlm.client import create_vlm_client
from pipelines.captions.engine import RECOGNIZER, CaptionEngine, SpeechBatcher, recognizer_claim
from pipelines.compute import ComputeBudget
from pipelines.describe.settings import DescribeEngine
from pipelines.detect import DETECTOR, detector_claim
from pipelines.segment.engine import SEGMENTER, SegmentEngine, segmenter_claim
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.jetstream import StreamConflictError, StreamSetupError
from realtime.bus.outbox import Outbox
from realtime.bus.publisher import BusUnavailable, NatsEventPublisher
from realtime.cli.errors import EXIT_RUNTIME, EXIT_USAGE, CommandError
from realtime.config import (
    CaptionsSettings,
    ComputeSettings,
    DetectorSettings,
    NatsSettings,
    SegmentationSettings,
    VlmConfig,
    validation_problems,
)

log = logging.getLogger(__name__)


async def load_configured_detector(
    settings: DetectorSettings,
    *,
    model: str | None = None,
    engine: str | None = None,
    conf: float | None = None,
    precision: str | None = None,
    cores: int | None = None,
) -> Any:
    """The detector the settings describe (arguments win); a bad model or engine is a CommandError.
    `cores` (compute.cores) sizes its CPU threads when detector.threads does not."""
    try:
        path = Path(model) if model else settings.model or default_detector_model()
        return await asyncio.to_thread(
            create_detector,
            path,
            engine or settings.engine,
            conf=conf or settings.conf,
            iou=settings.iou,
            threads=settings.threads or cores,
            workers=settings.workers,
            precision=precision or settings.precision,
            calibration=settings.calibration,
        )
    except (ValueError, ModelNotFound, EngineUnavailable) as exc:  # ModelLoadError is a ValueError
        raise CommandError(str(exc)) from exc


def asr_threads() -> int:
    """CTranslate2's own default is 4 threads whatever the machine: more than a small machine's cores."""
    return max(1, min(4, os.cpu_count() or 1))


def compute_budget(
    settings: ComputeSettings,
    captions: CaptionsSettings,
    detector: Any,
    *,
    captions_on: bool = True,
    segmentation: SegmentationSettings | None = None,
) -> ComputeBudget | None:
    """One budget for the cores when the detector shares them with another model (the recognizer,
    the segmenter; see pipelines.compute), with the detector's claim; the others add theirs once
    loaded (open_captions, open_segmentation). None when the scheduler is off or nothing shares the
    detector's CPU."""
    if not settings.scheduler or not str(detector.backend).endswith("-cpu"):
        return None
    recognizer_on_cpu = captions_on and captions.enabled and captions.device != "cuda"
    segmenter_on_cpu = (
        segmentation is not None and segmentation.enabled and segmentation.backend in ("auto", "onnx-cpu")
    )
    if not (recognizer_on_cpu or segmenter_on_cpu):
        return None
    cores = settings.cores or os.cpu_count() or 1
    share = captions.cpu_share or settings.captions_max_share
    budget = ComputeBudget(cores, critical_max_share=share, reserve_hold_s=settings.captions_reserve_s)
    budget.add(DETECTOR, detector_claim(detector, cores))
    log.info(
        "compute budget on",
        extra={"cores": cores, "captions_max_share": share},
    )
    return budget


@contextlib.asynccontextmanager
async def open_captions(
    settings: CaptionsSettings, *, enabled: bool = True, compute: ComputeBudget | None = None
) -> AsyncIterator[CaptionEngine | None]:
    """The shared speech recognizer and voice detector the settings describe, serving for the
    duration (None when captions are off); a bad model or device is a CommandError."""
    if not (enabled and settings.enabled):
        yield None
        return
    try:
        recognizer = await asyncio.to_thread(
            create_recognizer,
            settings.model,
            device=settings.device,
            compute_type=settings.compute_type,
            language=settings.language,
            beam_size=settings.beam_size,
            threads=settings.threads or (compute.cores if compute is not None else asr_threads()),
        )
        vad = await asyncio.to_thread(VadModel.load)
    except (AsrUnavailable, ValueError, OSError) as exc:
        raise CommandError(f"captions: {exc} (or turn them off: captions.enabled: false)") from exc
    if compute is not None:
        compute.add(RECOGNIZER, recognizer_claim(recognizer))
    try:
        async with SpeechBatcher(recognizer, max_batch=settings.max_batch, compute=compute) as batcher:
            yield CaptionEngine(batcher, vad, settings.to_policy())
    finally:
        recognizer.close()


def with_vlm_url(settings: VlmConfig, url: str | None) -> VlmConfig:
    """`--vlm-url` wins over the config's endpoints (checked like them)."""
    if not url:
        return settings
    try:
        return VlmConfig.model_validate({**settings.model_dump(), "endpoints": [url]})
    except ValidationError as exc:
        messages = "; ".join(p["message"] for p in validation_problems(exc))
        raise CommandError(f"--vlm-url: {messages}", EXIT_USAGE) from None


@contextlib.asynccontextmanager
async def open_describer(settings: VlmConfig) -> AsyncIterator[DescribeEngine | None]:
    """The VLM client every stream's describer shares, for the duration; None (said once, here)
    when no endpoint is configured."""
    if not settings.enabled:
        log.info("no VLM configured (vlm.endpoints, --vlm-url): running without scene descriptions")
        yield None
        return
    try:
        client = create_vlm_client(settings.client_settings())
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    log.info("scene descriptions on", extra={"endpoints": settings.endpoints, "model": settings.model})
    try:
        yield DescribeEngine(client, settings.model, settings.describe_settings())
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def open_segmentation(
    settings: SegmentationSettings, *, compute: ComputeBudget | None = None
) -> AsyncIterator[SegmentEngine | None]:
    """The segmenter every stream shares, for the duration; None when segmentation is off. A bad
    model or an unavailable backend is a CommandError naming the setting."""
    if not settings.enabled:
        yield None
        return
    from engines.segment import open_segmenter

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
        raise CommandError(f"segmentation: {exc}") from exc
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


def open_outbox(settings: NatsSettings) -> Outbox | None:
    """The disk outbox the settings ask for (None without `outbox_dir`); the publisher owns it."""
    if settings.outbox_dir is None:
        return None
    try:
        return Outbox(settings.outbox_dir, max_events=settings.outbox_max_events, max_bytes=settings.outbox_max_bytes)
    except OSError as exc:  # OutboxError is one too (e.g. another process has the directory locked)
        raise CommandError(f"nats.outbox_dir {settings.outbox_dir}: {exc}", EXIT_RUNTIME) from exc


@contextlib.asynccontextmanager
async def open_bus(nats_url: str | None, settings: NatsSettings, node: str) -> AsyncIterator[NatsEventPublisher]:
    """Connect to the given NATS, or start an embedded server for the duration; with the
    configured disk outbox in front of it."""
    embedded: EmbeddedNatsServer | None = None
    store: tempfile.TemporaryDirectory[str] | None = None
    if nats_url is None:
        store = tempfile.TemporaryDirectory(prefix="vidsentry-nats-")
        embedded = EmbeddedNatsServer(store_dir=Path(store.name))
        await asyncio.to_thread(embedded.start)
        nats_url = embedded.url
        print(f"vidsentry: embedded NATS at {nats_url} (vidsentry subscribe --nats-url {nats_url})",
              file=sys.stderr)
    try:
        outbox = open_outbox(settings)
        try:
            publisher = NatsEventPublisher(
                nats_url,
                node=node,
                connect_timeout=settings.connect_timeout_s,
                stream_max_age_s=settings.stream_max_age_s,
                stream_replicas=settings.replicas,
                outbox=outbox,
            )
        except BaseException:
            if outbox is not None:
                outbox.close()
            raise
        try:
            try:
                await publisher.connect()
            except BusUnavailable as exc:
                raise CommandError(str(exc), EXIT_RUNTIME) from exc
            except StreamConflictError as exc:  # the operator's streams disagree with ours: a setting to fix
                raise CommandError(str(exc), EXIT_USAGE) from exc
            except StreamSetupError as exc:
                raise CommandError(str(exc), EXIT_RUNTIME) from exc
            yield publisher
        finally:
            with contextlib.suppress(Exception):
                await publisher.close()  # closes the outbox too
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        if store is not None:
            store.cleanup()
