"""The caption stage of one stream: its audio to `partials` and `captions` events.

Audio arrives as 16 kHz mono chunks. A per-stream voice detector (Silero, shared model, own
state) decides when someone speaks; silence and noise never reach Whisper. While someone speaks
the utterance's audio is decoded again every `step_s` of new audio through the shared recognizer
(one request in flight per stream; the recognizer batches streams together). LocalAgreement
turns successive decodes into finals that never change (`captions`) and a tentative tail
(`partials`, replaced by a higher `revision` of the same `segment_id`, and finally by the
`captions` event with that id). A pause of `endpoint_s` ends the utterance: one last decode,
everything pending becomes final. A recognizer with room decodes the whole utterance, so each word
is heard with the speech before it; continuous speech longer than `max_window_s` is cut at its
committed words so no decode grows past that. A loaded recognizer gets short windows instead (cut
after each sentence and mid-sentence, the committed words forced as the decode's prefix). Committed
text before the window is Whisper's prompt. Decodes that look like Whisper's failure modes (a
repetition loop, speech-free audio) are not used.

Audio waiting longer than `max_lag_s` (the recognizer cannot keep up) is dropped, oldest first,
and counted. If the shared recognizer dies, this stream's captions stop (counted, logged once)
and its video goes on.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engines.asr.types import AsrRequest, AsrResult
from engines.asr.vad import StreamVad
from pipelines.audio_meter import audio_counters
from pipelines.captions.agreement import LocalAgreement, Word, cut_repetition, join_words
from pipelines.captions.engine import CaptionEngine, RecognizerBusy, RecognizerFailed
from pipelines.captions.window import AudioWindow
from pipelines.event_bodies import caption_event, partial_event
from pipelines.events import EventSink
from pipelines.frames import AudioChunk
from pipelines.graph import StageContext, counter, register_counters
from pipelines.graph.counters import Counters
from pipelines.mailbox import AudioBuffer, MailboxClosed

log = logging.getLogger(__name__)

STAGE_NAME = "captions"
GAP_S = 0.5  # a jump in media time this large (dropped audio, a restarted clock) ends the utterance
LOST_AUDIO_S = 0.02  # a smaller hole than GAP_S but at least this (lost packets) is filled with silence
MIN_SPEECH_WINDOWS = 2  # 64 ms of speech starts an utterance; one loud click does not
MIN_DECODE_S = 0.3
COMMITTED_KEPT = 256  # committed words remembered for the prompt
SENTENCE_END = re.compile(r"[.?!][\"')\]]*$")
TRAILING_PUNCTUATION = re.compile(r"[^\w\s']+$")
# A recognizer with room decodes the whole utterance up to max_window_s: Whisper hears each word
# with the speech before it, as an offline transcription does. On the speech set (bench_captions.py,
# wer part) the policy of cutting the window after each committed sentence (at most 12 s) and forcing
# the committed words still in it as the decode's prefix was 3.3 WER points worse with tiny.en and
# 5.5 with a Whisper base; the prefix alone cost 1.3 and 0.9 (a forced error steers the words after
# it) and saved no decode time.
# While the shared recognizer is loaded, windows are kept short for the streams' sake: cut after
# each committed sentence (MIN_TRIM_S, SENTENCE_CONTEXT_S) and mid-sentence once committed words
# fill more than COMMITTED_KEPT_S of it (a second of them stays as sound, the rest is prompt and
# prefix): every decode re-reads the whole window, so committed audio left in it is paid for again
# at every step. That halves a decode's cost, which doubled the streams kept in real time.
MIN_TRIM_S = 2.5  # a window this long is cut after its committed sentence (loaded)
SENTENCE_CONTEXT_S = 1.0  # of the committed sentence, kept as sound before the next one
COMMITTED_KEPT_S = 2.0
TRIM_CONTEXT_S = 1.0  # committed speech kept as sound by such a cut
LOADED_MAX_WINDOW_S = 6.0  # max_window_s while the recognizer is that loaded
TRIM_LOAD = 0.5  # recognizer load (share of its workers' time busy) from which windows are cut mid-sentence
# Past this load every stream waits for a longer step before its next decode: fewer, slightly later
# partials for all, instead of audio piling up until it is dropped.
STRETCH_LOAD = 0.7
STRETCH = 1.5
MIN_CUT_S = 0.5  # smaller cuts are not worth a re-join of the window
LOSSLESS_AUDIO_S = 300.0  # a bound still: 19 MB of float32 audio

register_counters(
    {
        "speech_seconds": counter("Seconds of audio the voice detector took for speech"),
        "captions": counter("Final caption segments published"),
        "caption_words": counter("Words in final captions"),
        "partials": counter("Partial caption updates published"),
        "asr_decodes": counter("Decodes of this stream's audio by the shared speech recognizer"),
        "asr_rejected": counter("Decodes not used: a repetition loop or no speech (Whisper's failure modes)"),
        "asr_errors": counter("Decodes that failed or were refused (recognizer busy or dead)"),
        "asr_short_windows": counter(
            "Decodes made with a short window and the committed words forced, the shared recognizer being loaded"
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


class CaptionStage:
    name = STAGE_NAME

    def __init__(
        self, stream_id: str, audio: AudioBuffer, engine: CaptionEngine, sink: EventSink, *, live: bool = True
    ) -> None:
        self.stream_id = stream_id
        # Live audio arrives steadily, so a wall-clock silence means the source went quiet and ends
        # the utterance; a file played as fast as it is processed arrives in bursts and only its
        # media time counts.
        self.live = live
        self.audio = audio
        self.engine = engine
        self.settings = engine.settings
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
        self._recognizer_gone = False

    # -- Stage -----------------------------------------------------------------------------------

    async def run(self) -> None:
        with self.engine.batcher.client():
            while True:
                try:
                    async with asyncio.timeout(self.settings.endpoint_s if self.live else None):
                        chunks = await self.audio.get_many()
                except TimeoutError:
                    chunks = []  # no audio for a while: a pending utterance may still end
                except MailboxClosed:
                    if self._speaking:
                        await self._decode(final=True)
                    return
                if self._recognizer_gone:
                    continue  # captions have stopped: the audio is taken and counted, nothing kept
                if not chunks:
                    await self._step(quiet=True)
                # Chunk by chunk: a burst (a file read ahead of real time) is decoded as it would
                # have been live, and the window never outgrows a decode.
                for chunk in chunks:
                    if self._feed(chunk):
                        if self._speaking:
                            await self._decode(final=True)  # a gap: the utterance before it ends here
                        self._reset(chunk)
                    await self._step(quiet=False)

    async def _step(self, *, quiet: bool) -> None:
        """End the utterance after a pause (or a quiet source), or decode when a step has grown."""
        if self._recognizer_gone or not self._speaking:
            return
        silent_for = self.window.end - self._last_voice
        if silent_for >= self.settings.endpoint_s or (quiet and self.window.duration > 0):
            await self._decode(final=True)
            self._end_utterance()
        elif self._decode_due():
            await self._decode(final=False)
            await self._bound_window()

    def _decode_due(self) -> bool:
        grown = self.window.end - self._decoded_to
        if grown < self.settings.step_s or self.window.duration < MIN_DECODE_S:
            return False
        return not self.live or grown >= STRETCH * self.settings.step_s or self.engine.batcher.load() < STRETCH_LOAD

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
            "asr_short_windows": stats.short_windows,
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
            self.agreement = LocalAgreement()
            self._sentence_cut = float("-inf")
        self._end_utterance()
        self.window.clear()
        self.vad.reset()
        self._vad_time = None
        self._take(chunk)

    def _take(self, chunk: AudioChunk) -> None:
        self._wall_offset = chunk.captured_at - (chunk.pts + chunk.duration)
        self._take_samples(chunk.pts, chunk.samples)

    def _take_samples(self, pts: float, samples: np.ndarray) -> None:
        self.window.append(pts, samples)
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

    # -- decoding ----------------------------------------------------------------------------------

    async def _decode(self, *, final: bool) -> None:
        if self._recognizer_gone or self.window.duration < MIN_DECODE_S:
            if final:
                await self._publish(self.agreement.flush(), [])
            return
        start = self.window.start
        self._decoded_to = self.window.end
        loaded = self._loaded()
        prefix = self._prefix(start) if loaded else ""
        self.stats.short_windows += loaded
        request = AsrRequest(self.window.audio(), prompt=self._prompt(start), prefix=prefix)
        result = await self._recognize(request)
        if result is None:
            committed, tentative = (self.agreement.flush(), []) if final else ([], self.agreement.pending)
        else:
            words = cut_repetition([Word(w.word, start + w.start, start + w.end, w.probability) for w in result.words])
            if final:
                committed, tentative = self.agreement.flush(words), []
            else:
                horizon = self.window.end - self.settings.edge_s
                committed, tentative = self.agreement.update(words, horizon=horizon)
            if log.isEnabledFor(logging.DEBUG):  # transcripts only at debug level
                log.debug(
                    "caption decode",
                    extra={
                        "stream_id": self.stream_id,
                        "window": [round(start, 2), round(self.window.end, 2)],
                        "final": final,
                        "loaded": loaded,
                        "heard": join_words(words),
                        "committed": join_words(committed),
                    },
                )
        await self._publish(committed, tentative, language=result.language if result else "en")

    async def _recognize(self, request: AsrRequest) -> AsrResult | None:
        """The recognizer's result, or None when it failed or looks like a Whisper failure mode."""
        try:
            outcome = await self.engine.batcher.submit(request)
        except RecognizerFailed as exc:
            self.stats.errors += 1
            self._recognizer_gone = True
            self._speaking = False
            self.window.clear()
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

    def _loaded(self) -> bool:
        """Windows are kept short (and forced to begin with their committed words) for other
        streams' sake; a file read ahead has no deadline."""
        return self.live and self.engine.batcher.load() >= TRIM_LOAD

    def _prefix(self, window_start: float) -> str:
        """The committed words still in the window, used while the recognizer is loaded (its
        windows are then cut short, often mid-sentence): the decode must begin with them. Without
        it, such a window is often heard as something else, and the decodes after it disagree
        until the utterance ends."""
        # The last word's punctuation is the decoder's to choose again: it was committed before the
        # pause after it was heard, and a forced comma makes the next sentence's start a guess.
        return TRAILING_PUNCTUATION.sub("", join_words([w for w in self._committed if w.end > window_start]))

    async def _bound_window(self) -> None:
        """Keep decodes within max_window_s of continuous speech and, while the recognizer is
        loaded, short: cut after each committed sentence. Speakers pause between sentences for less
        than an endpoint, so without that cut every step would decode the whole monologue again."""
        loaded = self._loaded()
        last = self._committed[-1] if self._committed else None
        if loaded and last is not None and SENTENCE_END.search(last.text) and last.end > self._sentence_cut:
            pending = self.agreement.pending
            if not pending:
                cut = last.end
            elif pending[0].start > last.end:  # in the pause between the sentences, never into a word
                cut = (last.end + pending[0].start) / 2
            else:
                cut = None
            if cut is not None and cut - self.window.start >= MIN_TRIM_S:
                # A second of the sentence before stays: cut right at a sentence's start, Whisper
                # guesses its first words with no sound before them ("The weather" -> "But wherever").
                # The words of that second are committed already and are recognised as such.
                self.window.trim_before(cut - SENTENCE_CONTEXT_S)
                self._sentence_cut = cut
        limit = self.settings.max_window_s
        if loaded:
            self._trim_committed()
            # Decodes that keep disagreeing grow the window, which makes every decode dearer and
            # slower: on a saturated recognizer that spirals. Give up on them sooner.
            limit = min(limit, LOADED_MAX_WINDOW_S)
        if self.window.duration <= limit:
            return
        # Cut before a committed word with a second of committed speech kept as sound: cut right at
        # the committed end, the next words are decoded with no sound before them. On the speech set
        # with edge_s 1.0 (windows reach the limit often) that cut cost 2.6 points of WER.
        self._trim_committed(kept_s=0.0)
        if self.window.duration > limit and self.agreement.committed_end > self.window.start + MIN_DECODE_S:
            self.window.trim_before(self.agreement.committed_end)
        if self.window.duration > limit:  # nothing agreed for that long
            await self._publish(self.agreement.flush(), [])
            self.window.keep_last(self.settings.pre_roll_s)

    def _trim_committed(self, kept_s: float = COMMITTED_KEPT_S) -> None:
        """Cut the window before a committed word so that about TRIM_CONTEXT_S of committed
        speech stays ahead of what is still pending; the cut lies in the gap before that word.
        Nothing is cut while the window holds no more than `kept_s` of committed speech."""
        end = self.agreement.committed_end
        if end - self.window.start <= kept_s:
            return
        words = [w for w in self._committed if w.start >= self.window.start]
        cut = None
        for before, word in zip(words, words[1:], strict=False):
            if word.start > end - TRIM_CONTEXT_S:
                break
            cut = (before.end + word.start) / 2
        if cut is not None and cut - self.window.start >= MIN_CUT_S:
            self.window.trim_before(cut)

    def _end_utterance(self) -> None:
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
                    model=self.engine.model_name,
                    captured_at=committed[-1].end + self._wall_offset,
                )
            )
            self._committed.extend(committed)
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
            )
        )
        self.stats.partials += 1

    def _segment_id(self) -> str:
        return f"{self._run_id}-{self._segment}"


def build(ctx: StageContext) -> CaptionStage | None:
    engine = ctx.engines.captions
    if engine is None or not ctx.spec.captions:
        return None
    # A file played as fast as possible delivers audio far ahead of real time: keep it, do not drop it.
    max_seconds = LOSSLESS_AUDIO_S if ctx.lossless else engine.settings.max_lag_s
    audio = ctx.audio(STAGE_NAME, max_seconds=max_seconds)
    return None if audio is None else CaptionStage(ctx.stream_id, audio, engine, ctx.sink, live=not ctx.lossless)
