"""ASR engine benchmark: audio-sized vs 30 s padded Whisper window, cost and accuracy, and batching.

    .venv/bin/python bench/bench_asr.py [--threads N] [--sizes 3,5,10] [--quick] [--tail-ms MS]

Writes bench/results/asr.json.

The espeak-ng narration (samples/narration.txt, ~50 s) is cut into pieces of about 3, 5 and 10 s,
two ways: at pauses found by the VAD ("pause", what endpointing produces) and at fixed times
("fixed", mid-word, what a growing partial buffer looks like). Every piece is transcribed alone
with window="audio" and window="padded"; the pieces' texts, joined, are scored against the script
(WER), once without a prompt and once with the previous pieces' text as the prompt (as a caption
pipeline conditions on committed text). Costs are medians per piece. Then four pieces as one batch
against the same four one by one, and window="audio" by the length of the silence it appends.
Single runs on a shared machine: compare within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from _common import ROOT, ensure_sample, table, write_results

from engines.asr import whisper as whisper_module
from engines.asr.types import AsrRequest
from engines.asr.vad import StreamVad, VadModel
from engines.asr.whisper import WhisperRecognizer, create_recognizer
from tests.support.speech import load_pcm16k, wer, words_of

NARRATION = ROOT / ".cache" / "samples" / "narration.wav"
SCRIPT = ROOT / "samples" / "narration.txt"
RATE = 16_000
WINDOWS: tuple[Literal["audio", "padded"], ...] = ("audio", "padded")
TAILS_S = (0.01, 1.0, 2.0, 3.0, 5.0)





def pause_centres(audio: np.ndarray, threshold: float = 0.35, min_windows: int = 5) -> list[int]:
    """Sample offsets in the middle of every run of >= min_windows non-speech VAD windows."""
    vad = StreamVad(VadModel.load())
    quiet = vad.process(audio) < threshold
    centres, run_start = [], None
    for i, q in enumerate([*quiet.tolist(), False]):
        if q and run_start is None:
            run_start = i
        elif not q and run_start is not None:
            if i - run_start >= min_windows:
                centres.append((run_start + i) // 2 * vad.window)
            run_start = None
    return centres


def cut(audio: np.ndarray, target_s: float, mode: str, pauses: list[int]) -> list[tuple[int, int]]:
    """Pieces covering the whole audio, each about target_s long (never over 30 s)."""
    step = int(target_s * RATE)
    if mode == "fixed":
        return [(s, min(s + step, len(audio))) for s in range(0, len(audio), step)]
    pieces, start = [], 0
    while len(audio) - start > 1.5 * step:
        ok = [p for p in pauses if start + step // 2 <= p <= start + 2 * step]
        end = min(ok, key=lambda p: abs(p - start - step)) if ok else start + step
        pieces.append((start, end))
        start = end
    pieces.append((start, len(audio)))
    return pieces


def transcribe_pieces(
    rec: WhisperRecognizer, audio: np.ndarray, pieces: list[tuple[int, int]], prompted: bool
) -> tuple[str, list[dict[str, float]], float]:
    texts: list[str] = []
    costs: list[dict[str, float]] = []
    worst_ratio = 0.0
    for start, end in pieces:
        prompt = " ".join(texts)[-400:] if prompted else ""
        t0 = time.perf_counter()
        result = rec.transcribe_batch([AsrRequest(audio[start:end], prompt=prompt)])[0]
        wall = (time.perf_counter() - t0) * 1000
        texts.append(result.text)
        worst_ratio = max(worst_ratio, result.compression_ratio)
        t = rec.last_timings
        costs.append(
            {
                "total_ms": wall,
                "features_ms": t.get("features_ms", 0.0),
                "encode_ms": t.get("encode_ms", 0.0),
                "decode_ms": t.get("generate_ms", 0.0) + t.get("align_ms", 0.0),
            }
        )
    return " ".join(texts), costs, worst_ratio


def batch_vs_singles(rec: WhisperRecognizer, clips: list[np.ndarray], repeat: int) -> dict[str, Any]:
    requests = [AsrRequest(c) for c in clips]
    batch_ms, singles_ms = [], []
    batch_texts: list[str] = []
    single_texts: list[str] = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        batch_texts = [r.text for r in rec.transcribe_batch(requests)]
        t1 = time.perf_counter()
        single_texts = [rec.transcribe_batch([q])[0].text for q in requests]
        t2 = time.perf_counter()
        batch_ms.append((t1 - t0) * 1000)
        singles_ms.append((t2 - t1) * 1000)
    b, s = statistics.median(batch_ms), statistics.median(singles_ms)
    same = sum(words_of(x) == words_of(y) for x, y in zip(batch_texts, single_texts, strict=True))
    return {"batch4_ms": b, "singles4_ms": s, "speedup": s / b, "same_words": f"{same}/{len(clips)}"}


def tail_sweep(
    rec: WhisperRecognizer, audio: np.ndarray, script: str, pieces: list[tuple[int, int]]
) -> list[dict[str, Any]]:
    """WER of window="audio" by the silence appended after the clip (the engine's AUDIO_TAIL)."""
    saved = whisper_module.AUDIO_TAIL, whisper_module.ALIGN_TAIL
    rows = []
    try:
        for tail_s in TAILS_S:
            whisper_module.AUDIO_TAIL = whisper_module.ALIGN_TAIL = int(tail_s * RATE)
            text, costs, _ = transcribe_pieces(rec, audio, pieces, prompted=False)
            prompted, _, _ = transcribe_pieces(rec, audio, pieces, prompted=True)
            rows.append(
                {
                    "tail_s": tail_s,
                    "encode_ms": statistics.median(c["encode_ms"] for c in costs),
                    "total_ms": statistics.median(c["total_ms"] for c in costs),
                    "wer": round(100 * wer(script, text), 1),
                    "wer_prompted": round(100 * wer(script, prompted), 1),
                }
            )
    finally:
        whisper_module.AUDIO_TAIL, whisper_module.ALIGN_TAIL = saved
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="CTranslate2 intra threads (0: its default)")
    parser.add_argument("--sizes", default="3,5,10", help="piece lengths in seconds")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each batch-vs-singles comparison")
    parser.add_argument("--quick", action="store_true", help="5 s pieces at pauses only, one batch run")
    parser.add_argument("--tail-ms", type=float, default=None, help="silence after the audio in window=audio")
    parser.add_argument("--compute-type", default="int8")
    args = parser.parse_args(argv)
    if args.tail_ms is not None:
        whisper_module.AUDIO_TAIL = whisper_module.ALIGN_TAIL = max(1, int(args.tail_ms * RATE / 1000))
    sizes = [5.0] if args.quick else [float(s) for s in args.sizes.split(",")]
    modes = ["pause"] if args.quick else ["pause", "fixed"]
    repeat = 1 if args.quick else args.repeat

    if not NARRATION.exists():
        ensure_sample()
    audio = load_pcm16k(NARRATION)
    script = SCRIPT.read_text()
    pauses = pause_centres(audio)
    print(f"narration {len(audio) / RATE:.1f} s, {len(pauses)} pauses; threads={args.threads}")

    recognizers: dict[str, WhisperRecognizer] = {}
    for kind in WINDOWS:
        rec = create_recognizer(device="cpu", compute_type=args.compute_type, threads=args.threads, window=kind)
        assert isinstance(rec, WhisperRecognizer)  # last_timings: the concrete class
        recognizers[kind] = rec
    rows: list[dict[str, Any]] = []
    batches: list[dict[str, Any]] = []
    try:
        for rec in recognizers.values():
            rec.transcribe_batch([AsrRequest(audio[: 3 * RATE])])  # warm-up: first calls pick kernels
        for mode in modes:
            for size in sizes:
                pieces = cut(audio, size, mode, pauses)
                lengths = [(e - s) / RATE for s, e in pieces]
                for window, rec in recognizers.items():
                    text, costs, ratio = transcribe_pieces(rec, audio, pieces, prompted=False)
                    prompted_text, _, prompted_ratio = transcribe_pieces(rec, audio, pieces, prompted=True)
                    row: dict[str, Any] = {
                        "cut": mode,
                        "size_s": size,
                        "pieces": len(pieces),
                        "mean_piece_s": round(statistics.mean(lengths), 2),
                        "window": window,
                        **{k: statistics.median(c[k] for c in costs) for k in costs[0]},
                        "wer": round(100 * wer(script, text), 1),
                        "wer_prompted": round(100 * wer(script, prompted_text), 1),
                        "max_cr": round(max(ratio, prompted_ratio), 2),
                        "text": text,
                        "text_prompted": prompted_text,
                    }
                    rows.append(row)
                    print(f"{mode} {size:g}s {window}: WER {row['wer']} % / prompted {row['wer_prompted']} %")
                if mode == "pause" and len(pieces) >= 4:
                    clips = [audio[s:e] for s, e in pieces[:4]]
                    for window, rec in recognizers.items():
                        batches.append({"size_s": size, "window": window, **batch_vs_singles(rec, clips, repeat)})
        sweep = [] if args.quick else tail_sweep(recognizers["audio"], audio, script, cut(audio, 5.0, "pause", pauses))
    finally:
        for rec in recognizers.values():
            rec.close()

    columns = ["cut", "size_s", "pieces", "window", "features_ms", "encode_ms", "decode_ms", "total_ms"]
    columns += ["wer", "wer_prompted", "max_cr"]
    print("\nper piece (medians), WER % of the joined pieces against the script\n" + table(rows, columns))
    print("\nfour pieces: one batch vs one by one\n" + table(batches, ["size_s", "window", *list(batches[0])[2:]]))
    speed = {}
    for mode in modes:
        for size in sizes:
            pair = {r["window"]: r for r in rows if r["cut"] == mode and r["size_s"] == size}
            speed[f"{mode}_{size:g}s"] = round(pair["padded"]["total_ms"] / pair["audio"]["total_ms"], 2)
    print("\npadded / audio time per piece: " + ", ".join(f"{k} {v}x" for k, v in speed.items()))
    if sweep:
        print(
            "\nwindow=audio, 5 s pieces at pauses, by silence appended after the audio\n" + table(sweep, list(sweep[0]))
        )

    import ctranslate2

    path = write_results(
        "asr",
        {
            "settings": {
                "threads": args.threads,
                "compute_type": args.compute_type,
                "model": recognizers["audio"].info.name,
                "audio_tail_ms": whisper_module.AUDIO_TAIL * 1000 / RATE,
                "beam_size": 1,
            },
            "ctranslate2": ctranslate2.__version__,
            "narration_s": len(audio) / RATE,
            "results": rows,
            "batching": batches,
            "tail_sweep": sweep,
            "padded_over_audio_time": speed,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
