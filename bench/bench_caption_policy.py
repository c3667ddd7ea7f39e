"""The caption streaming policy alone, on bench_realtime.py's speech (a diagnostic, not a headline).

bench_realtime.py measures live WER with every stage on; this separates what the streaming policy
(VAD utterances, re-decoded windows, LocalAgreement) costs on that same audio from what live load
adds. The camera's speech through the clip's AAC and the peer's through aiortc's Opus, exactly as
bench_realtime.py's offline side hears them, go through the production caption stage in file mode
(decodes land every step_s of audio, as on a recognizer with room), one stream after the other or
both at once on one recognizer (--together: their decodes share calls, as two live streams' do).
WER over the whole speech, against the offline transcription bench_realtime.py uses (the same model
on Whisper's padded window, pieces of at most 28 s cut between sentences, each prompted with the
text before it). --set key=value (repeatable) overrides CaptionPolicy fields.

--speech picks bench_realtime.py's material (paused, continuous, heldout).

Usage: .venv/bin/python bench/bench_caption_policy.py [--speech continuous] [--together] [--set edge_s=0.5] [--show]
Results: bench/results/bench_caption_policy.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
from typing import Any

import bench_realtime as live
from _common import table, write_results
from _speech_set import stream_file

from engines.asr.vad import VadModel
from engines.asr.whisper import create_recognizer
from pipelines.captions.config import DEFAULT_BEAM_SIZE
from pipelines.captions.engine import CaptionPolicy, SpeechBatcher
from tests.support.speech import wer


@dataclasses.dataclass(frozen=True)
class _Run:
    """What bench_realtime.Offline reads of a stream run."""

    kind: str
    speech: live.Speech


def settings_from(pairs: list[str]) -> CaptionPolicy:
    fields = {f.name: f.type for f in dataclasses.fields(CaptionPolicy)}
    values: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in fields:
            raise SystemExit(f"--set {pair}: CaptionPolicy has no field {key!r} (fields: {', '.join(fields)})")
        values[key] = (value == "true") if value in ("true", "false") else float(value) if "." in value else int(value)
    return CaptionPolicy(**values)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    material = live.MATERIALS[args.speech]
    camera, peer = live.material_speech(material, material.camera), live.material_speech(material, material.peer)
    digest = hashlib.sha1(camera.audio.tobytes()).hexdigest()[:12]  # as bench_realtime.camera_clip names it
    clips = sorted(live.CACHE.glob(f"camera-{digest}-*.mp4"), key=lambda p: p.stat().st_mtime)
    if not clips:
        raise SystemExit(f"no camera clip of the {args.speech} speech under {live.CACHE}: run "
                         f"bench/bench_realtime.py --speech {args.speech} once to build it")  # fmt: skip
    clip = clips[-1]
    offline = live.Offline(clip)
    runs = [_Run("camera", camera), _Run("webrtc", peer)]
    audio = [offline.audio(r, codec=True)[: len(r.speech.audio)] for r in runs]  # type: ignore[arg-type]
    settings = settings_from(args.set)
    recognizer = create_recognizer(None, device="cpu", compute_type="int8", beam_size=args.beam_size)
    vad = VadModel.load()
    async with SpeechBatcher(recognizer, max_batch=8) as batcher:
        feeds = [stream_file(batcher, vad, settings, a, lead_s=args.lead_s, trail_s=2.0) for a in audio]
        if args.together:
            streamed = await asyncio.gather(*feeds)
        else:
            streamed = [await feed for feed in feeds]
    rows = []
    for run, out in zip(runs, streamed, strict=True):
        reference = " ".join(s.text for s in run.speech.sentences)
        cut = live.Cut(0.0, run.speech.seconds, reference, len(run.speech.sentences))
        heard = offline.text(run, cut, codec=True)  # type: ignore[arg-type]
        on, off = 100 * wer(reference, out.text), 100 * wer(reference, heard)
        kept = 100 * wer(reference, out.transcript)
        rows.append({"stream": run.speech.name, "words": run.speech.words, "decodes": out.decodes,
                     "streaming_wer_pct": round(on, 1), "offline_wer_pct": round(off, 1),
                     "difference_points": round(on - off, 1), "transcript_wer_pct": round(kept, 1),
                     "transcript_difference_points": round(kept - off, 1)})
        if args.show:
            print(f"{run.speech.name} streamed: {out.text}\n{run.speech.name} transcript: {out.transcript}\n"
                  f"{run.speech.name} offline:  {heard}\n")
    offline.close()
    recognizer.close()
    print(table(rows, list(rows[0])))
    return {"settings": dataclasses.asdict(settings), "speech": args.speech, "together": args.together,
            "lead_s": args.lead_s,
            "beam_size": args.beam_size, "clip": clip.name, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--together", action="store_true", help="both streams at once on one recognizer")
    parser.add_argument("--speech", choices=tuple(live.MATERIALS), default="paused",
                        help="bench_realtime.py's speech material (its camera clip must have been built)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a CaptionPolicy field")
    parser.add_argument("--show", action="store_true", help="print the streamed and offline texts")
    parser.add_argument("--beam-size", type=int, default=DEFAULT_BEAM_SIZE,
                        help="the streaming decodes' beam (captions.beam_size)")
    parser.add_argument("--lead-s", type=float, default=0.0,
                        help="silence before the speech: moves every decode point against the words")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    name = "bench_caption_policy" + ("" if args.speech == "paused" else f"_{args.speech}")
    print(f"wrote {write_results(name, result)}")


if __name__ == "__main__":
    main()
