"""Build the sample clip: OpenCV's vtest.avi with a spoken narration muxed in as AAC.

Output (default directory .cache/samples):
  vtest.avi          the original surveillance footage (768x576, 10 fps, no audio)
  narration.wav      espeak-ng speech of samples/narration.txt, 16 kHz mono s16
  vtest_speech.mp4   H.264 (keyframe every second, no B-frames) + AAC 16 kHz mono

vtest.avi comes from Debian's opencv-doc package (`apt-get download`, no root needed);
espeak-ng must be installed (deploy/setup.sh does both). Re-running is cheap: existing
outputs are kept unless --force.
"""

from __future__ import annotations

import argparse
import glob
import shutil
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / ".cache" / "samples"
VTEST_IN_DEB = "./usr/share/doc/opencv-doc/examples/data/vtest.avi"
SAMPLE_RATE = 16_000


def fetch_vtest(out: Path) -> Path:
    target = out / "vtest.avi"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        print("downloading Debian package opencv-doc for vtest.avi ...", file=sys.stderr)
        subprocess.run(["apt-get", "download", "opencv-doc"], cwd=tmp, check=True, capture_output=True)
        deb = glob.glob(f"{tmp}/opencv-doc_*.deb")[0]
        fsys = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", VTEST_IN_DEB], cwd=tmp, input=fsys, check=True)
        shutil.move(f"{tmp}/{VTEST_IN_DEB}", target)
    return target


def synthesize_narration(out: Path, text_file: Path) -> Path:
    target = out / "narration.wav"
    if target.exists():
        return target
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is not installed: run deploy/setup.sh (or apt-get install espeak-ng)")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "speech22k.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-f", str(text_file), "-w", str(raw)], check=True)
        samples = _read_audio_16k_mono(raw)
    with av.open(str(target), "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=SAMPLE_RATE, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return target


def _read_audio_16k_mono(path: Path) -> np.ndarray:
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    chunks: list[np.ndarray] = []
    with av.open(str(path)) as container:
        for frame in container.decode(audio=0):
            chunks.extend(f.to_ndarray().reshape(-1) for f in resampler.resample(frame))
    chunks.extend(f.to_ndarray().reshape(-1) for f in resampler.resample(None))
    return np.concatenate(chunks).astype(np.int16)


def mux_clip(out: Path, video: Path, narration: Path) -> Path:
    target = out / "vtest_speech.mp4"
    if target.exists():
        return target
    speech = _read_audio_16k_mono(narration)
    partial = target.with_suffix(".partial.mp4")
    with av.open(str(video)) as src, av.open(str(partial), "w", options={"movflags": "+faststart"}) as dst:
        fps = Fraction(10, 1)
        vout = dst.add_stream("libx264", rate=fps)
        vout.width, vout.height, vout.pix_fmt = 768, 576, "yuv420p"
        vout.options = {"g": "10", "bf": "0", "preset": "veryfast", "crf": "23"}
        aout = dst.add_stream("aac", rate=SAMPLE_RATE, layout="mono")
        aout.bit_rate = 64_000
        for index, frame in enumerate(src.decode(video=0)):
            new = frame.reformat(format="yuv420p")
            new.pts, new.time_base = index, Fraction(1, 10)
            for packet in vout.encode(new):
                dst.mux(packet)
        for packet in vout.encode(None):
            dst.mux(packet)
        afr = av.AudioFrame.from_ndarray(speech.reshape(1, -1), format="s16", layout="mono")
        afr.sample_rate, afr.pts, afr.time_base = SAMPLE_RATE, 0, Fraction(1, SAMPLE_RATE)
        for packet in aout.encode(afr):
            dst.mux(packet)
        for packet in aout.encode(None):
            dst.mux(packet)
    partial.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rebuild outputs that already exist")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.force:
        for name in ("narration.wav", "vtest_speech.mp4"):
            (args.out / name).unlink(missing_ok=True)
    video = fetch_vtest(args.out)
    narration = synthesize_narration(args.out, HERE / "narration.txt")
    clip = mux_clip(args.out, video, narration)
    print(clip)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
