"""The ASR engine on the real bundled tiny.en (CTranslate2 int8, CPU) and Silero VAD v6 (ONNX Runtime),
fed espeak-ng speech: words, timings, batching, silence and noise, VAD streaming, and load errors."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from engines.asr.features import log_mel_batch
from engines.asr.languages import WHISPER_LANGUAGES, check_language
from engines.asr.types import AUTO, AsrRequest, AsrResult, AsrUnavailable
from engines.asr.vad import StreamVad, VadModel
from engines.asr.whisper import WhisperRecognizer, create_recognizer, default_asr_model
from tests.support.languages import spoken
from tests.support.speech import load_pcm16k, wer, words_of

RATE = 16_000
SCRIPT = Path(__file__).resolve().parents[2] / "samples" / "narration.txt"
DOOR = "Please open the front door and turn on the kitchen lights."


@pytest.fixture(scope="module")
def recognizer() -> Iterator[WhisperRecognizer]:
    rec = create_recognizer(device="cpu", threads=2)
    assert isinstance(rec, WhisperRecognizer)
    yield rec
    rec.close()


@pytest.fixture(scope="module")
def vad_model() -> VadModel:
    return VadModel.load()


@pytest.fixture(scope="module")
def door_clip(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is not installed: run deploy/setup.sh")
    wav = tmp_path_factory.mktemp("speech") / "door.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(wav), DOOR], check=True, capture_output=True, timeout=30)
    return load_pcm16k(wav)


@pytest.fixture(scope="module")
def narration(sample_dir: Path) -> np.ndarray:
    return load_pcm16k(sample_dir / "narration.wav")


def transcribe(rec: WhisperRecognizer, audio: np.ndarray, prompt: str = "") -> AsrResult:
    return rec.transcribe_batch([AsrRequest(audio, prompt)])[0]


# -- recognition ------------------------------------------------------------------------------------


def test_the_bundled_model_loads_as_tiny_en_on_cpu(recognizer: WhisperRecognizer) -> None:
    assert default_asr_model().joinpath("model.bin").is_file()
    assert recognizer.info.name == "tiny.en"
    assert recognizer.info.device == "cpu"
    assert recognizer.info.compute_type.startswith("int8")
    assert recognizer.info.sample_rate == RATE


def test_a_spoken_sentence_comes_back_as_its_words(recognizer: WhisperRecognizer, door_clip: np.ndarray) -> None:
    result = transcribe(recognizer, door_clip)
    assert {"open", "front", "door", "kitchen", "lights"} <= set(words_of(result.text))
    assert wer(DOOR, result.text) <= 0.2
    assert result.language == "en"
    assert result.no_speech_prob < 0.3
    assert -1.0 < result.avg_logprob <= 0.0
    assert 0.5 < result.compression_ratio < 2.0
    assert words_of("".join(w.word for w in result.words)) == words_of(result.text)
    assert all(w.word.startswith(" ") for w in result.words)  # Whisper's spelling, leading space kept
    assert all(0.0 <= w.probability <= 1.0 for w in result.words)


def test_word_times_lie_inside_the_audio_and_increase(recognizer: WhisperRecognizer, door_clip: np.ndarray) -> None:
    lead = 2.0  # seconds of silence before the speech: times are the request's own audio clock
    audio = np.concatenate([np.zeros(int(lead * RATE), np.float32), door_clip])
    duration = len(audio) / RATE
    words = transcribe(recognizer, audio).words
    assert len(words) >= 8
    starts = [w.start for w in words]
    assert starts == sorted(starts)
    assert all(0.0 <= w.start <= w.end <= duration for w in words)
    assert lead - 0.4 <= words[0].start <= lead + 0.8
    assert words[-1].end >= duration - 1.5


def test_a_batch_reads_the_same_as_its_requests_one_by_one(
    recognizer: WhisperRecognizer, door_clip: np.ndarray, narration: np.ndarray
) -> None:
    clips = [door_clip, narration[: int(4.6 * RATE)]]  # different lengths: the shorter is padded
    batch = recognizer.transcribe_batch([AsrRequest(c) for c in clips])
    assert recognizer.last_timings["groups"] == 1
    singles = [transcribe(recognizer, c) for c in clips]
    assert [words_of(r.text) for r in batch] == [words_of(r.text) for r in singles]
    assert "library" in words_of(batch[1].text)


def test_prompted_and_unprompted_requests_share_a_batch(
    recognizer: WhisperRecognizer, door_clip: np.ndarray, narration: np.ndarray
) -> None:
    requests = [
        AsrRequest(narration[int(4.6 * RATE) : int(8.6 * RATE)], prompt="This is the north entrance camera."),
        AsrRequest(door_clip),
        AsrRequest(narration[: int(4.6 * RATE)], prompt="Good"),
    ]
    results = recognizer.transcribe_batch(requests)
    # CTranslate2 needs every prompt to be as long: no-prompt and prompt requests decode as two groups.
    assert recognizer.last_timings["groups"] == 2
    assert {"people", "walking", "square"} <= set(words_of(results[0].text))
    assert {"front", "door"} <= set(words_of(results[1].text))
    assert {"library", "plaza"} <= set(words_of(results[2].text))


class _SpiedModel:
    """The CTranslate2 model, with the beam each `generate` call was given written down."""

    def __init__(self, model: object) -> None:
        self._model = model
        self.beams: list[int] = []

    def generate(self, *args: object, **kwargs: object) -> object:
        self.beams.append(int(kwargs["beam_size"]))  # type: ignore[call-overload]
        return self._model.generate(*args, **kwargs)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)


def test_a_request_may_ask_for_its_own_beam(
    recognizer: WhisperRecognizer, narration: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the code owes: each request's beam reaches the decoder, one generate call per beam. The
    # words a beam hears differ from greedy's on one CPU and not on another: not asserted.
    clip = narration[int(18 * RATE) : int(24 * RATE)]
    spy = _SpiedModel(recognizer._model)
    monkeypatch.setattr(recognizer, "_model", spy)
    greedy, beam = recognizer.transcribe_batch([AsrRequest(clip), AsrRequest(clip, beam_size=3)])
    assert recognizer.last_timings["groups"] == 2  # one generate call has one beam
    assert sorted(spy.beams) == [1, 3]
    monkeypatch.undo()
    assert words_of(greedy.text) == words_of(transcribe(recognizer, clip).text)
    assert words_of(beam.text) == words_of(recognizer.transcribe_batch([AsrRequest(clip, beam_size=3)])[0].text)


def test_a_prefix_is_what_the_decode_starts_with(recognizer: WhisperRecognizer, door_clip: np.ndarray) -> None:
    # Forced even where the audio says otherwise: the words after it are decoded from the sound.
    result = recognizer.transcribe_batch([AsrRequest(door_clip, prefix="Please shut the")])[0]
    said = words_of(result.text)
    assert said[:3] == ["please", "shut", "the"]
    assert {"door", "kitchen", "lights"} <= set(said[3:])
    assert len(result.words) >= 8 and result.words[0].start < result.words[-1].end  # the prefix is timed too


def test_prefixes_of_different_lengths_share_a_batch(
    recognizer: WhisperRecognizer, door_clip: np.ndarray, narration: np.ndarray
) -> None:
    clip = narration[: int(4.6 * RATE)]
    requests = [AsrRequest(door_clip, prefix="Please open the front"), AsrRequest(clip, prefix="Good")]
    door, story = recognizer.transcribe_batch(requests)
    assert words_of(door.text)[:4] == ["please", "open", "the", "front"]
    assert words_of(story.text)[0] == "good" and "morning" in words_of(story.text)


def test_two_workers_decode_side_by_side_as_one_would(door_clip: np.ndarray, narration: np.ndarray) -> None:
    rec = create_recognizer(device="cpu", threads=2)
    assert rec.workers == 2  # the CPU default: two one-thread calls at once
    clips = [door_clip, narration[: int(4.6 * RATE)]]
    try:
        alone = [rec.transcribe_batch([AsrRequest(c)])[0].text for c in clips]
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda c: rec.transcribe_batch([AsrRequest(c)])[0].text, clips))
    finally:
        rec.close()
    assert together == alone
    assert create_recognizer(device="cpu", threads=1).workers == 1


def test_the_narration_reads_within_twenty_percent_wer(recognizer: WhisperRecognizer, narration: np.ndarray) -> None:
    step = 10 * RATE
    pieces = [AsrRequest(narration[s : s + step]) for s in range(0, len(narration), step)]
    text = " ".join(r.text for r in recognizer.transcribe_batch(pieces))
    assert wer(SCRIPT.read_text(), text) <= 0.2


def test_silence_gives_no_words(recognizer: WhisperRecognizer) -> None:
    for seconds in (1.0, 5.0):
        result = transcribe(recognizer, np.zeros(int(seconds * RATE), np.float32))
        assert result.words == () or result.no_speech_prob > 0.6


def test_white_noise_gives_no_words_or_a_high_no_speech_probability(recognizer: WhisperRecognizer) -> None:
    noise = (np.random.default_rng(7).standard_normal(3 * RATE) * 0.1).astype(np.float32)  # -20 dBFS
    result = transcribe(recognizer, noise)
    assert result.words == () or result.no_speech_prob > 0.6


def test_empty_batches_and_tiny_clips_never_reach_the_model(recognizer: WhisperRecognizer) -> None:
    assert recognizer.transcribe_batch([]) == []
    results = recognizer.transcribe_batch([AsrRequest(np.zeros(800, np.float32)), AsrRequest(np.zeros(0, np.float32))])
    assert [r.text for r in results] == ["", ""]
    assert all(r.words == () and r.no_speech_prob == 1.0 for r in results)
    assert recognizer.last_timings == {}


def test_requests_it_cannot_serve_are_refused(recognizer: WhisperRecognizer) -> None:
    with pytest.raises(ValueError, match="at most 30"):
        recognizer.transcribe_batch([AsrRequest(np.zeros(31 * RATE, np.float32))])
    with pytest.raises(ValueError, match="mono"):
        recognizer.transcribe_batch([AsrRequest(np.zeros((2, RATE), np.float32))])


def test_the_log_mel_matches_faster_whispers() -> None:
    from faster_whisper.feature_extractor import FeatureExtractor

    clip = (np.random.default_rng(1).standard_normal(3 * RATE) * 0.2).astype(np.float32)
    reference = FeatureExtractor()(np.pad(clip, (0, 30 * RATE - len(clip))))[:, :3000]
    assert np.abs(log_mel_batch([clip], 3000)[0] - reference).max() < 1e-4
    short = FeatureExtractor()(clip)  # 3 s + one hop of padding: 301 frames
    assert np.abs(log_mel_batch([clip], 301)[0] - short).max() < 1e-4


# -- load errors ----------------------------------------------------------------------------------


def test_a_missing_model_dir_is_named_with_what_it_needs(tmp_path: Path) -> None:
    with pytest.raises(AsrUnavailable, match=r"does not exist.*model\.bin, config\.json, tokenizer\.json"):
        create_recognizer(tmp_path / "nowhere", device="cpu")
    with pytest.raises(AsrUnavailable, match=rf"{re.escape(str(tmp_path))} lacks model\.bin, config\.json"):
        create_recognizer(tmp_path, device="cpu")


def test_a_broken_model_dir_is_refused_with_its_path(tmp_path: Path) -> None:
    for name in ("model.bin", "config.json", "tokenizer.json"):
        (tmp_path / name).write_text("{}")
    with pytest.raises(AsrUnavailable, match=rf"{re.escape(str(tmp_path))} could not be loaded"):
        create_recognizer(tmp_path, device="cpu")


def test_cuda_without_a_gpu_says_what_to_install() -> None:
    import ctranslate2

    if ctranslate2.get_cuda_device_count() > 0:
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(AsrUnavailable, match=r"sees no CUDA device.*cuDNN"):
        create_recognizer(device="cuda")


def test_an_english_only_model_refuses_another_language() -> None:
    with pytest.raises(ValueError, match="English-only"):
        create_recognizer(device="cpu", language="de")


def test_a_closed_recognizer_refuses_work(door_clip: np.ndarray) -> None:
    rec = create_recognizer(device="cpu", threads=1)
    rec.close()
    rec.close()
    with pytest.raises(AsrUnavailable, match="closed"):
        rec.transcribe_batch([AsrRequest(door_clip)])


# -- VAD ------------------------------------------------------------------------------------------


def test_vad_hears_speech_and_not_silence(vad_model: VadModel, door_clip: np.ndarray) -> None:
    stream = StreamVad(vad_model)
    silence = stream.process(np.zeros(RATE, np.float32))
    assert len(silence) == RATE // 512 and silence.max() < 0.2
    stream.reset()
    speech = stream.process(door_clip)
    assert len(speech) == len(door_clip) // 512
    assert (speech > 0.5).mean() > 0.5


def test_vad_in_20_ms_chunks_equals_one_call(vad_model: VadModel, narration: np.ndarray) -> None:
    audio = narration[: 6 * RATE]
    whole = StreamVad(vad_model).process(audio)
    stream = StreamVad(vad_model)
    chunked = np.concatenate([stream.process(audio[i : i + 320]) for i in range(0, len(audio), 320)])
    assert len(whole) == len(chunked) == len(audio) // 512
    np.testing.assert_allclose(chunked, whole, atol=1e-5)
    assert whole.max() > 0.9 and whole.min() < 0.2  # speech and a pause: not a flat answer
    stream.reset()
    np.testing.assert_allclose(stream.process(audio), whole, atol=1e-5)  # reset forgets the past


def test_vad_streams_keep_their_own_state(vad_model: VadModel, narration: np.ndarray) -> None:
    speech, silence = narration[: 2 * RATE], np.zeros(2 * RATE, np.float32)
    a, b = StreamVad(vad_model), StreamVad(vad_model)
    alone = StreamVad(vad_model).process(silence)
    a.process(speech)  # interleaved with b, and must not leak into it
    np.testing.assert_allclose(b.process(silence), alone, atol=1e-6)


def test_vad_refuses_a_model_that_is_not_silero_v6(tmp_path: Path, nudenet_model: Path) -> None:
    with pytest.raises(AsrUnavailable, match="does not exist"):
        VadModel.load(tmp_path / "missing.onnx")
    with pytest.raises(AsrUnavailable, match="expected Silero VAD v6"):
        VadModel.load(nudenet_model)
    (tmp_path / "junk.onnx").write_bytes(b"not onnx")
    with pytest.raises(AsrUnavailable, match="could not be loaded"):
        VadModel.load(tmp_path / "junk.onnx")


def test_a_request_asking_auto_is_detected_where_the_recognizer_is_held_to_a_language() -> None:
    spanish = spoken("es", 1)
    french_held = create_recognizer("base", language="fr", threads=1)
    try:
        held, detected = french_held.transcribe_batch([AsrRequest(spanish), AsrRequest(spanish, language=AUTO)])
        assert held.language == "fr" and detected.language == "es"
        # Every code the settings take is one the model's tokenizer knows (a code it does not fails the batch).
        for code in WHISPER_LANGUAGES:
            french_held._language_token(code)
    finally:
        french_held.close()
    english = create_recognizer(threads=1)
    try:
        [result] = english.transcribe_batch([AsrRequest(spanish[:16_000], language=AUTO)])
        assert result.language == "en"  # an English-only model hears English whatever it is asked
    finally:
        english.close()
    assert check_language(" ES ") == "es"
    with pytest.raises(ValueError, match="not one Whisper knows"):
        check_language("xx")
