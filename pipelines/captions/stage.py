"""The caption stage of one stream: its audio to `partials`, `captions` and `transcript` events.

Audio arrives as 16 kHz mono chunks. A per-stream voice detector (Silero, shared model, own
state) decides when someone speaks; silence and noise never reach Whisper. While someone speaks
the window is decoded again every `step_s` of new audio through the shared recognizer (one
request in flight per stream; the recognizer batches streams together); live, at the newest
audio, so a slow decode makes the next step longer rather than leaving steps behind.
LocalAgreement turns successive decodes into finals that never change (`captions`) and a
tentative tail (`partials`, replaced by a higher `revision` of the same `segment_id`, and
finally by the `captions` event with that id). A pause of `endpoint_s` ends the utterance: one
last decode, everything pending becomes final.

The window is bounded whatever the utterance's length (policy.py): committed words leave it as
the decoder's prompt, the last seconds of them stay as sound and are the decode's forced prefix,
fewer while the stage trails its newest audio. The committed speech is decoded once more in
pieces of a few seconds, with context on both sides, as the `transcript` that replaces the
finals where captions are read back (transcript.py); those decodes run beside the stream's own,
so the finals never wait for them. Decodes that look like Whisper's failure modes (a repetition
loop, speech-free audio) are not used.

A stream may choose its own model, language and English track (`streams[].captions: {...}`): its
policy carries the language and the translation, and a model other than the section's is leased
from the engine's shelf for as long as the stage runs (models.py); one the shelf refuses leaves
this stream's captions off (counted, logged) and its video going on.

With a recognizer that detects the language (`captions.language: auto`), an utterance's first
final fixes its language for the decodes after it, and every body says it; with
`captions.translate`, each transcript is decoded once more with Whisper's translate task through
the transcripts' batcher (bulk work, after the stream's own decodes) and published as its English
`translations` line.

Audio waiting longer than `max_lag_s` (the recognizer cannot keep up even so) is dropped, oldest
first, and counted. If the shared recognizer dies, this stream's captions stop (counted, logged
once) and its video goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from engines.asr.types import AsrRequest, AsrResult
from engines.asr.vad import StreamVad
from pipelines.audio_meter import audio_counters
from pipelines.captions import policy
from pipelines.captions.agreement import (
    LocalAgreement,
    Word,
    cut_repetition,
    drop_repeated_sentences,
    join_words,
    repeated_start,
)
from pipelines.captions.config import AUTO, CaptionsStreamSettings
from pipelines.captions.engine import CAPTIONS, CaptionEngine, CaptionPolicy, RecognizerBusy, RecognizerFailed
from pipelines.captions.models import ModelRefused, ServedModel
from pipelines.captions.transcript import (
    MISSED_WORDS_OK,
    Piece,
    UtteranceRecorder,
    after_prefix,
    forced_text,
    unheard,
)
from pipelines.captions.window import AudioWindow
from pipelines.event_bodies import caption_event, partial_event, transcript_event, translation_event
from pipelines.events import EventSink
from pipelines.frames import AudioChunk
from pipelines.graph import StageContext, counter, gauge, register_counters
from pipelines.graph.counters import Counters
from pipelines.mailbox import AudioBuffer, MailboxClosed

log = logging.getLogger(__name__)

STAGE_NAME = "captions"
GAP_S = 0.5  # a jump in media time this large (dropped audio, a restarted clock) ends the utterance
LOST_AUDIO_S = 0.02  # a smaller hole than GAP_S but at least this (lost packets) is filled with silence
MIN_SPEECH_WINDOWS = 2  # 64 ms of speech starts an utterance; one loud click does not
COMMITTED_KEPT = 256  # committed words remembered for the prompt
LOSSLESS_AUDIO_S = 300.0  # a bound still: 19 MB of float32 audio
# Transcript decodes waiting behind the running one; a piece past them is published with its finals
# (counted in transcripts_kept_finals): a recognizer that far behind needs its time for the finals.
TRANSCRIPTS_WAITING = 3

register_counters(
    {
        "speech_seconds": counter("Seconds of audio the voice detector took for speech"),
        "captions": counter("Final caption segments published"),
        "caption_words": counter("Words in final captions"),
        "partials": counter("Partial caption updates published"),
        "asr_decodes": counter("Decodes of this stream's audio by the shared speech recognizer"),
        "asr_rejected": counter("Decodes not used: a repetition loop or no speech (Whisper's failure modes)"),
        "asr_errors": counter("Decodes that failed or were refused (recognizer busy or dead)"),
        "caption_words_overdue": counter(
            "Final words committed as the newest decode said them, captions.overdue_s behind the audio,"
            " without two decodes agreeing on them"
        ),
        "asr_short_windows": counter(
            "Decodes made with a tight window (1-2 s of committed speech kept), the stage having fallen behind"
        ),
        "caption_lag_seconds": gauge("Audio that arrived while the stage's decodes ran (smoothed): how far it trails"),
        "asr_repeated_words": counter(
            "Words of decodes dropped for saying the words before them again (Whisper repeating its prompt,"
            " or a sentence said twice in one decode)"
        ),
        "transcripts": counter("Utterances (or pieces of long ones) published as transcript events"),
        "transcripts_changed": counter("Transcripts whose words differ from the finals they replace"),
        "transcripts_kept_finals": counter(
            "Transcripts that repeat their finals: the whole decode failed, looked like a Whisper failure mode,"
            " or was not made because the recognizer was that far behind"
        ),
        "transcripts_retried": counter(
            "Transcript pieces decoded a second time, greedily: the beam's decode left out words the finals heard"
        ),
        "translations": counter("Transcripts published again as English text (captions.translate), as `translations`"),
        "translations_missed": counter(
            "Transcripts with no English track: the translate decode failed, looked wrong or was not made"
        ),
        "caption_model_refused": gauge(
            "1 when the model the stream names for its captions could not be served (captions.max_models, or"
            " not installed): its captions are off"
        ),
        "transcript_unheard_seconds": counter(
            "Seconds of speech left out of transcripts: nothing was final in more than Whisper's 30 s window"
        ),
    },
    section="captions",
)


@dataclass(slots=True)
class CaptionStats:
    speech_seconds: float = 0.0
    captions: int = 0
    words: int = 0
    partials: int = 0
    decodes: int = 0
    rejected: int = 0
    errors: int = 0
    short_windows: int = 0
    repeated_words: int = 0  # dropped by the transcript's guards (the agreement counts its own)
    overdue_words: int = 0  # of agreements since replaced (the current one counts its own)
    transcripts: int = 0
    transcripts_changed: int = 0
    transcripts_kept_finals: int = 0
    transcripts_retried: int = 0
    translations: int = 0
    translations_missed: int = 0


@dataclass(frozen=True, slots=True)
class Spoken:
    """What a translation needs of its transcript."""

    text: str
    start: float
    end: float
    language: str


@dataclass(frozen=True, slots=True)
class _Queued:
    """A piece waiting for its transcript, and how to publish it."""

    piece: Piece
    decode: bool  # False: the recognizer was too far behind; its finals are the transcript
    wall_offset: float  # captured_at - media time when the piece was cut
    language: str | None  # its utterance's, as its first final heard it; None: none yet (detected)


class CaptionStage:
    name = STAGE_NAME

    def __init__(
        self,
        stream_id: str,
        audio: AudioBuffer,
        engine: CaptionEngine,
        sink: EventSink,
        *,
        live: bool = True,
        settings: CaptionPolicy | None = None,
        model: str | None = None,
    ) -> None:
        self.stream_id = stream_id
        # Live audio arrives steadily, so a wall-clock silence means the source went quiet and ends
        # the utterance; a file played as fast as it is processed arrives in bursts and only its
        # media time counts.
        self.live = live
        self.audio = audio
        self.engine = engine
        # The stream's own policy and model where it chose them (`streams[].captions: {...}`).
        self.settings = settings or engine.settings
        self.model = model  # a model the engine's shelf serves; None: the section's
        self._served = ServedModel(engine.batcher, engine.transcripts)
        self.sink = sink
        self.stats = CaptionStats()
        self.vad = StreamVad(engine.vad)
        self.window = AudioWindow()
        self.agreement = LocalAgreement()
        self._committed: deque[Word] = deque(maxlen=COMMITTED_KEPT)
        self._run_id = secrets.token_hex(3)  # segment ids stay unique when the stream runs again
        self._segment = 0
        self._revision = -1
        self._partial_text = ""
        self._speaking = False
        self._speech_run = 0
        self._last_voice = 0.0  # media time of the last window that sounded like speech
        self._decoded_to = 0.0  # window end at the last decode
        self._sentence_cut = float("-inf")  # where the window may be cut: in the pause after the last sentence
        self._vad_time: float | None = None  # media time of the next VAD window's start
        self._wall_offset = 0.0  # captured_at - media time, from the newest chunk
        self._lag = 0.0  # seconds of audio that arrived while decodes ran (smoothed)
        self._bound = policy.ROOMY
        self._recognizer_gone = False
        self._model_refused = False
        self._utterance = UtteranceRecorder() if self.settings.transcript else None
        self._pieces: asyncio.Queue[_Queued | None] = asyncio.Queue()  # decodes among them: TRANSCRIPTS_WAITING
        self._decodes_waiting = 0
        # The utterance's language, from its first final on: its later decodes are held to it, so
        # one utterance is never captioned in two languages (detection on a second of audio errs).
        self._spoken: str | None = None

    # -- Stage -----------------------------------------------------------------------------------

    async def run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            if self.model is not None and self.engine.shelf is not None:
                try:
                    self._served = await stack.enter_async_context(self.engine.shelf.lease(self.model))
                except ModelRefused as exc:  # the audio is still taken and counted; video goes on
                    self._model_refused = True
                    self._recognizer_gone = True
                    log.error("captions off for this stream: the model it names cannot be served",
                              extra={"stream_id": self.stream_id, "model": self.model, "reason": str(exc)})
            await self._run()

    async def _run(self) -> None:
        with self._served.batcher.client():
            async with asyncio.TaskGroup() as tasks:
                if self._utterance is not None:
                    tasks.create_task(self._write_transcripts(), name=f"{self.stream_id}-transcripts")
                try:
                    await self._stream()
                finally:
                    self._pieces.put_nowait(None)  # the writer publishes what is queued, then ends

    async def _stream(self) -> None:
        """The stream's audio to finals, until its buffer closes."""
        while True:
            try:
                async with asyncio.timeout(self.settings.endpoint_s if self.live else None):
                    chunks = await self.audio.get_many()
            except TimeoutError:
                chunks = []  # no audio for a while: a pending utterance may still end
            except MailboxClosed:
                if self._speaking:
                    await self._decode(final=True)
                    self._end_transcript()
                return
            if self._recognizer_gone:
                continue  # captions have stopped: the audio is taken and counted, nothing kept
            if not chunks:
                await self._step(quiet=True)
            # Chunk by chunk for the voice detector and the endpoints. A file read ahead of real
            # time is decoded as it would have been live, a step at a time; a live stream decodes
            # once, at its newest audio: the audio that arrived while the last decode ran is one
            # longer step, not a backlog of steps that a slow decode could never work off.
            for index, chunk in enumerate(chunks):
                if self._feed(chunk):
                    if self._speaking:
                        await self._decode(final=True)  # a gap: the utterance before it ends here
                        self._end_transcript()
                    self._reset(chunk)
                await self._step(quiet=False, newest=not self.live or index == len(chunks) - 1)

    async def _step(self, *, quiet: bool, newest: bool = True) -> None:
        """End the utterance after a pause (or a quiet source), or decode when a step has grown."""
        if self._recognizer_gone or not self._speaking:
            return
        silent_for = self.window.end - self._last_voice
        if silent_for >= self.settings.endpoint_s or (quiet and self.window.duration > 0):
            await self._decode(final=True)
            self._end_transcript()
            self._end_utterance()
        elif newest and self._decode_due():
            await self._decode(final=False)
            self._note_lag()
            await self._bound_window()
            if self._utterance is not None:
                pending = self.agreement.pending
                self._queue_transcript(self._utterance.due(pending[0].start if pending else None))

    @property
    def _said_in(self) -> str:
        """The language of words no decode has told: the utterance's, else the stream's (English when detected)."""
        held = self.settings.language
        return self._spoken or (held if held not in (None, AUTO) else "en")

    def _decode_due(self) -> bool:
        return policy.decode_due(grown_s=self.window.end - self._decoded_to, window_s=self.window.duration,
                                 step_s=self.settings.step_s, live=self.live, load=self._served.batcher.load())

    def stop(self) -> None:
        """Nothing to do: the stage ends when its audio buffer closes."""

    def counters(self) -> Counters:
        stats = self.stats
        return {
            **audio_counters(self.audio),
            "speech_seconds": round(stats.speech_seconds, 2),
            "captions": stats.captions,
            "caption_words": stats.words,
            "partials": stats.partials,
            "asr_decodes": stats.decodes,
            "asr_rejected": stats.rejected,
            "asr_errors": stats.errors,
            "caption_words_overdue": stats.overdue_words + self.agreement.overdue_commits,
            "asr_short_windows": stats.short_windows,
            "caption_lag_seconds": round(self._lag, 3),
            "asr_repeated_words": stats.repeated_words + self.agreement.repeats_dropped,
            "transcripts": stats.transcripts,
            "transcripts_changed": stats.transcripts_changed,
            "transcripts_kept_finals": stats.transcripts_kept_finals,
            "transcripts_retried": stats.transcripts_retried,
            "translations": stats.translations,
            "translations_missed": stats.translations_missed,
            "caption_model_refused": int(self._model_refused),
            "transcript_unheard_seconds": round(self._utterance.untranscribed_s, 2) if self._utterance else 0.0,
        }

    # -- audio in --------------------------------------------------------------------------------

    def _feed(self, chunk: AudioChunk) -> bool:
        """Voice detection and the window; True when the chunk does not follow the window's audio."""
        if self.window.duration:
            missing = chunk.pts - self.window.end
            if abs(missing) > GAP_S:
                return True
            if missing >= LOST_AUDIO_S:  # lost packets: silence keeps every later word at its time
                self._take_samples(chunk.pts - missing, np.zeros(int(missing * chunk.sample_rate), np.float32))
        self._take(chunk)
        return False

    def _reset(self, chunk: AudioChunk) -> None:
        if chunk.pts < self.window.end:  # the media clock went back: what was committed is in its future
            self.stats.repeated_words += self.agreement.repeats_dropped
            self.stats.overdue_words += self.agreement.overdue_commits
            self.agreement = LocalAgreement()
            self._sentence_cut = float("-inf")
        self._end_utterance()
        self.window.clear()
        if self._utterance is not None:
            self._utterance.clear()
        self.vad.reset()
        self._vad_time = None
        self._take(chunk)

    def _take(self, chunk: AudioChunk) -> None:
        self._wall_offset = chunk.captured_at - (chunk.pts + chunk.duration)
        self._take_samples(chunk.pts, chunk.samples)

    def _take_samples(self, pts: float, samples: np.ndarray) -> None:
        self.window.append(pts, samples)
        if self._utterance is not None:
            self._utterance.append(pts, samples)
        if self._vad_time is None:
            self._vad_time = pts
        settings = self.settings
        step = self.vad.window / self.window.rate
        for probability in self.vad.process(samples):
            self._vad_time += step
            if probability >= settings.vad_threshold:
                self.stats.speech_seconds += step
            if self._speaking:
                if probability >= settings.vad_threshold - 0.15:
                    self._last_voice = self._vad_time
                continue
            self._speech_run = self._speech_run + 1 if probability >= settings.vad_threshold else 0
            if self._speech_run >= MIN_SPEECH_WINDOWS:
                self._speaking = True
                self._last_voice = self._vad_time
                self._decoded_to = self.window.end
        if not self._speaking:
            self.window.keep_last(settings.pre_roll_s)
            if self._utterance is not None:
                self._utterance.idle(settings.pre_roll_s)

    # -- decoding ----------------------------------------------------------------------------------

    async def _decode(self, *, final: bool) -> None:
        if self._recognizer_gone or self.window.duration < policy.MIN_DECODE_S:
            if final:
                await self._publish(self.agreement.flush(), [])
            return
        start = self.window.start
        self._decoded_to = self.window.end
        tight = self._bound is policy.TIGHT
        self.stats.short_windows += tight
        prefix = policy.forced_prefix(self._committed, start)
        language = self._spoken or self.settings.language
        request = AsrRequest(self.window.audio(), prompt=self._prompt(start), prefix=prefix, language=language)
        result = await self._recognize(request)
        if result is None:
            committed, tentative = (self.agreement.flush(), []) if final else ([], self.agreement.pending)
        else:
            words = cut_repetition([Word(w.word, start + w.start, start + w.end, w.probability) for w in result.words])
            if final:
                committed, tentative = self.agreement.flush(words), []
            else:
                horizon = self.window.end - self.settings.edge_s
                overdue = self.window.end - self.settings.overdue_s if self.settings.overdue_s > 0 else float("-inf")
                committed, tentative = self.agreement.update(words, horizon=horizon, overdue=overdue)
            if log.isEnabledFor(logging.DEBUG):  # transcripts only at debug level
                log.debug(
                    "caption decode",
                    extra={
                        "stream_id": self.stream_id,
                        "window": [round(start, 2), round(self.window.end, 2)],
                        "final": final,
                        "tight": tight,
                        "heard": join_words(words),
                        "committed": join_words(committed),
                    },
                )
        await self._publish(committed, tentative, language=result.language if result else self._said_in)

    async def _recognize(self, request: AsrRequest, *, whole: bool = False) -> AsrResult | None:
        """The recognizer's result, or None when it failed or looks like a Whisper failure mode;
        `whole`: an utterance's transcript, through the engine's transcriber."""
        batcher = self._served.transcriber if whole else self._served.batcher
        try:
            outcome = await batcher.submit(request)
        except RecognizerFailed as exc:
            self.stats.errors += 1
            self._recognizer_gone = True
            self._speaking = False
            self.window.clear()
            if self._utterance is not None:
                self._utterance.clear()
            log.error(
                "captions stopped: the speech recognizer failed",
                extra={"stream_id": self.stream_id, "reason": exc.reason},
            )
            return None
        except RecognizerBusy:
            self.stats.errors += 1
            return None
        except Exception as exc:  # one failed call: this decode is lost, the next one may work
            self.stats.errors += 1
            log.warning("caption decode failed", extra={"stream_id": self.stream_id, "error": repr(exc)})
            return None
        self.stats.decodes += 1
        result = outcome.result
        settings = self.settings
        looping = result.compression_ratio > settings.max_compression_ratio
        silent = result.no_speech_prob > settings.no_speech_prob and result.avg_logprob < settings.min_avg_logprob
        if looping or silent:
            self.stats.rejected += 1
            return None
        return result

    def _prompt(self, window_start: float) -> str:
        before = [w for w in self._committed if w.end <= window_start]
        return join_words(before)[-self.settings.prompt_chars :]

    def _note_lag(self) -> None:
        """The stage's lag after a decode: the audio that arrived while it ran and waits to be
        taken (a file read ahead has no deadline and no lag). It chooses the window's bound."""
        newest = self.audio.buffered_seconds if self.live else 0.0
        self._lag = policy.smoothed_lag(self._lag, newest)
        self._bound = policy.window_bound(self._lag, tight=self._bound is policy.TIGHT)

    async def _bound_window(self) -> None:
        """Keep the window within its bound: cut after each committed sentence and once committed
        words fill more than the bound keeps. Speakers pause between sentences for less than an
        endpoint, so without these cuts every step would decode the whole monologue again."""
        bound = self._bound.capped(self.settings.max_window_s)
        last = self._committed[-1] if self._committed else None
        cut = policy.sentence_cut(self.window.start, last, self.agreement.pending, self._sentence_cut, bound.context_s)
        if cut is not None:
            # The words of the context kept before the cut are committed already and are
            # recognised as such (the decode's forced prefix).
            self.window.trim_before(cut - bound.context_s)
            self._sentence_cut = cut
        self._trim_committed(kept_s=bound.kept_s, context_s=bound.context_s)
        if self.window.duration <= bound.limit_s:
            return
        # Cut before a committed word with a second of committed speech kept as sound: cut right at
        # the committed end, the next words are decoded with no sound before them.
        self._trim_committed(kept_s=0.0, context_s=policy.TIGHT.context_s)
        committed_end = self.agreement.committed_end
        if self.window.duration > bound.limit_s and committed_end > self.window.start + policy.MIN_DECODE_S:
            self.window.trim_before(committed_end)
        if self.window.duration > bound.limit_s:  # nothing agreed for that long
            await self._publish(self.agreement.flush(), [])
            self.window.keep_last(self.settings.pre_roll_s)

    def _trim_committed(self, *, kept_s: float, context_s: float) -> None:
        cut = policy.committed_cut(
            self.window.start, self._committed, self.agreement.committed_end, kept_s=kept_s, context_s=context_s
        )
        if cut is not None:
            self.window.trim_before(cut)

    # -- the transcript --------------------------------------------------------------------------

    def _end_transcript(self) -> None:
        if self._utterance is not None:
            self._queue_transcript(self._utterance.finish())

    def _queue_transcript(self, piece: Piece | None) -> None:
        if piece is None or self._utterance is None:
            return
        decode = self._decodes_waiting < TRANSCRIPTS_WAITING
        if decode:
            self._decodes_waiting += 1
        else:
            piece = replace(piece, audio=piece.audio[:0])  # only its finals are published: no audio kept
        self._pieces.put_nowait(_Queued(piece, decode, self._wall_offset, self._spoken))

    async def _write_transcripts(self) -> None:
        """The stream's transcripts in order, each decode beside the stream's streaming decodes."""
        while (queued := await self._pieces.get()) is not None:
            if queued.decode:
                self._decodes_waiting -= 1
            await self._transcribe(queued)

    async def _transcribe(self, queued: _Queued) -> None:
        """Decode the piece with its context and publish it as the transcript of its segments;
        the finals themselves when that decode cannot be used (or was not made)."""
        piece, utterance = queued.piece, self._utterance
        assert utterance is not None
        finals = piece.finals
        words, language = finals, queued.language or self._said_in
        if queued.decode and not self._recognizer_gone and piece.end - piece.start >= policy.MIN_DECODE_S:
            # The whole piece is more to detect its language from than the first final had.
            heard = await self._decode_piece(piece, utterance, self.settings.language)
            if heard is not None:
                words, language = heard
        revised = words is not finals
        changed = [w.key for w in words] != [w.key for w in finals]
        self.stats.transcripts += 1
        self.stats.transcripts_changed += changed
        self.stats.transcripts_kept_finals += not revised
        utterance_id = f"{self._run_id}-u{self.stats.transcripts}"
        start = min(piece.segments[0].words[0].start, words[0].start)
        end = max(piece.segments[-1].end, words[-1].end)
        await self.sink.publish(
            transcript_event(
                self.stream_id,
                utterance_id=utterance_id,
                replaces=[s.segment_id for s in piece.segments],
                words=[(w.text, w.start, w.end, w.probability) for w in words],
                start=start,
                end=end,
                revised=revised,
                changed=changed,
                language=language,
                model=self._served.name,
                captured_at=words[-1].end + queued.wall_offset,  # as a final's: when its last word was heard
            )
        )
        utterance.remember(words)
        if self.settings.translate is not None and self.settings.transcript:
            spoken = Spoken(join_words(words), start, end, language)
            await self._translate(queued, utterance_id, spoken)

    async def _translate(self, queued: _Queued, utterance_id: str, said: Spoken) -> None:
        """The English track of one transcript, over its span: its piece's audio decoded with the
        translate task, through the transcripts' bulk batcher (speech in English is its
        transcript's text)."""
        language = said.language
        piece = queued.piece
        target = self.settings.translate or "en"
        if language == target or not queued.decode:
            text = said.text if language == target else ""
        else:
            rate = self.window.rate
            begin = max(0, int(round((piece.start - piece.audio_start) * rate)))
            end = int(round((piece.end - piece.audio_start) * rate))
            request = AsrRequest(
                piece.audio[begin:end],
                beam_size=self.settings.transcript_beam_size,
                language=language,
                task="translate",
            )
            result = None if self._recognizer_gone else await self._recognize(request, whole=True)
            text = result.text if result is not None else ""
        if not text:
            self.stats.translations_missed += 1
            return
        self.stats.translations += 1
        await self.sink.publish(
            translation_event(
                self.stream_id,
                utterance_id=utterance_id,
                text=text,
                start=said.start,
                end=said.end,
                spoken_language=language,
                language=target,
                model=self._served.name,
                captured_at=piece.end + queued.wall_offset,
            )
        )

    async def _decode_piece(
        self, piece: Piece, utterance: UtteranceRecorder, language: str | None = None
    ) -> tuple[list[Word], str] | None:
        """The piece's words as a decode with the transcript's last words as its forced prefix
        hears them (None: no usable decode, or it heard nothing of the piece). A beam search
        sometimes ends its hypothesis early, mid-piece, leaving words the finals heard out: such a
        piece is decoded once more, greedily, and the decode that left out fewer is used."""
        begin, prefix = utterance.context(piece)
        audio = piece.audio[int(round((begin - piece.audio_start) * self.window.rate)) :]
        request = AsrRequest(
            audio,
            prompt=utterance.prompt(prefix)[-self.settings.prompt_chars :],
            prefix=forced_text(prefix),
            beam_size=self.settings.transcript_beam_size,
            language=language,
        )
        best: tuple[list[Word], str] | None = None
        missed = len(piece.finals) + 1
        for beam in dict.fromkeys((request.beam_size, 1)):
            if beam != request.beam_size:
                self.stats.transcripts_retried += 1
            result = await self._recognize(replace(request, beam_size=beam), whole=True)
            if result is not None:
                heard = self._piece_words(result, piece, begin, prefix, utterance)
                left_out = len(unheard(piece.finals, heard))
                if heard and left_out < missed:
                    best, missed = (heard, result.language), left_out
            if missed <= MISSED_WORDS_OK or self._recognizer_gone:
                break
        return best

    def _piece_words(
        self, result: AsrResult, piece: Piece, begin: float, prefix: Sequence[Word], utterance: UtteranceRecorder
    ) -> list[Word]:
        decoded = [Word(w.word, begin + w.start, begin + w.end, w.probability) for w in result.words if w.word.strip()]
        fresh = after_prefix(decoded, prefix)
        if not prefix:  # no transcript before it in its audio: the piece's words are those after its start
            fresh = [w for w in fresh if (w.start + w.end) / 2 >= piece.start]
        fresh = cut_repetition([w for w in fresh if (w.start + w.end) / 2 <= piece.end])
        heard = drop_repeated_sentences(fresh)
        # A start saying the transcript's end again is Whisper repeating its prompt.
        heard = heard[repeated_start([w.key for w in heard], utterance.keys()) :]
        self.stats.repeated_words += len(fresh) - len(heard)
        return heard

    def _end_utterance(self) -> None:
        self._spoken = None
        self._speaking = False
        self._speech_run = 0
        self.window.keep_last(self.settings.pre_roll_s)

    # -- events out --------------------------------------------------------------------------------

    async def _publish(self, committed: Sequence[Word], tentative: Sequence[Word], language: str = "en") -> None:
        if committed:
            segment_id = self._segment_id()
            words = [(w.text, w.start, w.end, w.probability) for w in committed]
            await self.sink.publish(
                caption_event(
                    self.stream_id,
                    segment_id=segment_id,
                    words=words,
                    language=language,
                    model=self._served.name,
                    captured_at=committed[-1].end + self._wall_offset,
                )
            )
            self._committed.extend(committed)
            if self._spoken is None:
                self._spoken = language
            if self._utterance is not None:
                self._utterance.add(segment_id, committed)
            self.stats.captions += 1
            self.stats.words += len(committed)
            self._segment += 1
            self._revision, self._partial_text = -1, ""
        text = join_words(tentative)
        if text == self._partial_text:
            return
        # A partial the final decode did not confirm is withdrawn with an empty revision.
        start = tentative[0].start if tentative else self.window.start
        end = tentative[-1].end if tentative else self.window.end
        self._revision += 1
        self._partial_text = text
        await self.sink.publish(
            partial_event(
                self.stream_id,
                segment_id=self._segment_id(),
                text=text,
                start=start,
                end=end,
                revision=self._revision,
                captured_at=end + self._wall_offset,
                language=self._spoken or language,
            )
        )
        self.stats.partials += 1

    def _segment_id(self) -> str:
        return f"{self._run_id}-{self._segment}"


def build(ctx: StageContext) -> CaptionStage | None:
    engine = ctx.engines.get(CAPTIONS)
    if engine is None or not ctx.spec.wants(STAGE_NAME):
        return None
    # A file played as fast as possible delivers audio far ahead of real time: keep it, do not drop it.
    max_seconds = LOSSLESS_AUDIO_S if ctx.lossless else engine.settings.max_lag_s
    audio = ctx.audio(STAGE_NAME, max_seconds=max_seconds)
    if audio is None:
        return None
    settings, model = stream_policy(engine, ctx.spec.own(STAGE_NAME), ctx.stream_id)
    return CaptionStage(ctx.stream_id, audio, engine, ctx.sink, live=not ctx.lossless, settings=settings, model=model)


def stream_policy(engine: CaptionEngine, own: object, stream_id: str = "") -> tuple[CaptionPolicy, str | None]:
    """The policy and model of a stream with its own captions settings (the engine's where it has
    none): its language and English track over the section's, its model if another than the
    section's. Settings the section cannot take were refused where the stream was configured or
    added; should one arrive all the same (a fleet worker's other config), the section's are used."""
    if not isinstance(own, CaptionsStreamSettings) or engine.section is None:
        return engine.settings, None
    try:
        section = own.over(engine.section)
    except ValueError as exc:
        log.warning("the stream's own captions settings do not fit this service's: its section's are used",
                    extra={"stream_id": stream_id, "reason": str(exc)})
        return engine.settings, None
    settings = replace(engine.settings, language=section.language or AUTO, translate=section.translate)
    model = section.model_name if section.model_name != engine.section.model_name else None
    return settings, model
