"""The speech recognizer every stream shares, and the caption settings of the service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engines.asr.types import AsrRequest, AsrResult, SpeechRecognizer
from engines.asr.vad import VadModel
from pipelines.batching import ModelBatcher, ModelFailed, QueueFull
from pipelines.compute import ComputeBudget, ModelClaim, Priority
from pipelines.graph.engines import EngineKey

if TYPE_CHECKING:
    from pipelines.captions.config import CaptionsSettings
    from pipelines.captions.models import ModelShelf

# Streams whose decodes may ride in one CTranslate2 call. Each stream has at most one request in
# flight, so this is also how many streams are served per call.
DEFAULT_MAX_BATCH = 8


RECOGNIZER = "speech recognizer"  # the batcher's name: in reasons, logs and compute shares
TRANSCRIBER = "speech recognizer, transcripts"  # the same model, for the whole-utterance decodes


def _threads_per_call(recognizer: SpeechRecognizer) -> int:
    return int(getattr(recognizer, "threads_per_call", 1))


def recognizer_claim(recognizer: SpeechRecognizer) -> ModelClaim:
    """The recognizer's place in a compute budget: first, always (up to the budget's bound), since a
    word decoded late is read late and audio that waits too long is lost, where a detection frame
    skipped is bridged by the tracker."""
    return ModelClaim(Priority.CRITICAL, threads=_threads_per_call(recognizer))


def transcriber_claim(recognizer: SpeechRecognizer) -> ModelClaim:
    """The transcript's decodes: bulk work, shared with detection by weight. A transcript arrives an
    utterance after its finals anyway; taking the cores first would cost the detector frames and,
    beside the streaming decodes, the finals their turn."""
    return ModelClaim(Priority.BULK, threads=_threads_per_call(recognizer))


class RecognizerFailed(ModelFailed):
    """The shared speech recognizer is unusable; captions stop, detection goes on."""


class RecognizerBusy(QueueFull):
    """Too many decodes are already waiting."""


@dataclass(frozen=True, slots=True)
class CaptionPolicy:
    """The streaming policy's knobs, as the stage uses them (the config's `captions:` section,
    `pipelines.captions.config.CaptionsSettings`, holds these and the recognizer's settings)."""

    # The latency/accuracy knob: the window is decoded again each time it has grown this much.
    # Smaller: earlier partials and finals, more compute; larger: fewer, better-informed decodes.
    step_s: float = 0.5
    endpoint_s: float = 0.6  # this much silence after speech ends the utterance (finalizes it)
    edge_s: float = 0.3  # words ending this close to the newest audio are never final yet (maybe cut short)
    # A word this far behind the newest audio is final as the newest decode says it, agreed or not:
    # it bounds the finals' lag where decodes keep disagreeing (0: never, only agreement commits).
    overdue_s: float = 1.0
    vad_threshold: float = 0.5  # speech probability from which a 32 ms window counts as speech
    pre_roll_s: float = 0.3  # audio kept before the detected start of speech
    max_window_s: float = 10.0  # the most audio a streaming decode hears (the lag-steered bound is within it)
    max_lag_s: float = 6.0  # audio waiting past this is dropped, oldest first (counted)
    prompt_chars: int = 200  # committed text before the window given to Whisper as context
    # Decode each utterance whole once it ended and publish it as `transcript` (see transcript.py).
    transcript: bool = True
    # Its decoder's beam, whatever the streaming decodes use: a streaming decode repeats every step,
    # the transcript's once per utterance, which can afford a beam (docs/captions.md).
    transcript_beam_size: int = 3
    # Guards against Whisper's known failure modes (a result that trips one is not used).
    max_compression_ratio: float = 2.4  # repetition loops compress well
    no_speech_prob: float = 0.6  # with a low avg_logprob: nothing was said
    min_avg_logprob: float = -1.0
    # "en": each transcript is also decoded as English text (Whisper's translate task), published as
    # `translations`; None: no English track.
    translate: str | None = None
    # The language the stream's decodes are held to; "auto": detected per utterance, whatever the
    # recognizer's own; None: the recognizer's own (an English-only one: English).
    language: str | None = None


class SpeechBatcher(ModelBatcher[AsrRequest, AsrResult]):
    def __init__(
        self,
        recognizer: SpeechRecognizer,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        compute: ComputeBudget | None = None,
        name: str = RECOGNIZER,
        workers: int | None = None,
    ) -> None:
        self.recognizer = recognizer
        super().__init__(
            recognizer.transcribe_batch,
            name=name,
            unit="decodes",
            max_batch=max_batch,
            failed_error=RecognizerFailed,
            full_error=RecognizerBusy,
            thread_name="vidsentry-asr",
            compute=compute,
            workers=recognizer.workers if workers is None else workers,
        )


@dataclass(frozen=True, slots=True)
class CaptionEngine:
    """What the caption stage of every stream shares."""

    batcher: SpeechBatcher
    vad: VadModel
    settings: CaptionPolicy = CaptionPolicy()
    # The whole-utterance decodes' own batcher at a lower priority in the compute budget (the same
    # recognizer); None: they share `batcher`.
    transcripts: SpeechBatcher | None = None
    # The models streams may choose for themselves (`streams[].captions.model`); None: every stream
    # has the section's.
    shelf: ModelShelf | None = None
    # The section as the engine serves it (a model that could not be installed falls back to tiny.en
    # in English): what a stream's own settings are applied over. None: streams have `settings`.
    section: CaptionsSettings | None = None

    @property
    def batchers(self) -> tuple[SpeechBatcher, ...]:
        return (self.batcher,) if self.transcripts is None else (self.batcher, self.transcripts)

    @property
    def every_batcher(self) -> tuple[SpeechBatcher, ...]:
        """The section's model's batchers and those of every model streams loaded besides it."""
        extra = self.shelf.served[1:] if self.shelf is not None else []
        return (*self.batchers, *(b for served in extra for b in served.batchers))

    @property
    def transcriber(self) -> SpeechBatcher:
        return self.transcripts or self.batcher

    @property
    def translates(self) -> bool:
        return self.settings.translate is not None and self.settings.transcript

    @property
    def model_name(self) -> str:
        return self.batcher.recognizer.info.name

    def health(self) -> dict[str, bool]:
        return {
            "asr": all(b.alive for b in self.batchers),
            "asr_responsive": not any(b.stuck for b in self.batchers),
        }


CAPTIONS: EngineKey[CaptionEngine] = EngineKey("captions")  # the engine in SharedEngines
