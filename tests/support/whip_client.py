"""Meetecho's `simple-whip-client` (the Debian package `deploy/setup.sh` installs) as a real
third-party WHIP publisher: a GStreamer test pattern as VP8 and a speech file as Opus, paced as
a live source would send them.

On Debian 12 the packaged client aborts as soon as webrtcbin loads libnice (libsoup 2 and 3 in
one process, see soup2_shim.c), so it runs with that small shim preloaded, built here once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

CLIENT = "whip-client"
SHIM_SOURCE = Path(__file__).with_name("soup2_shim.c")
EXIT_WITHIN_S = 10.0  # after SIGTERM the client sends its DELETE and stops its pipeline

TEST_PATTERN = (
    "videotestsrc is-live=true pattern=smpte ! video/x-raw,width=640,height=480,framerate=15/1 ! videoconvert ! "
    "queue ! vp8enc deadline=1 ! rtpvp8pay pt=96 ssrc=2 ! queue ! "
    "application/x-rtp,media=video,encoding-name=VP8,payload=96"
)


def speech_pipeline(wav: Path) -> str:
    """A WAV file played in real time (identity sync=true: a file is not a live source) as Opus."""
    return (
        f"filesrc location={wav} ! wavparse ! identity sync=true ! audioconvert ! audioresample ! queue ! "
        "opusenc ! rtpopuspay pt=100 ssrc=1 ! queue ! application/x-rtp,media=audio,encoding-name=OPUS,payload=100"
    )


def build_shim(into: Path) -> Path:
    """The preload library (needs a C compiler: deploy/setup.sh installs g++, with gcc)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler to build soup2_shim.c: run deploy/setup.sh")
    library = into / "soup2_shim.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(SHIM_SOURCE), "-ldl"], check=True)
    return library


def client_path() -> str:
    path = shutil.which(CLIENT)
    if path is None:
        raise RuntimeError(f"{CLIENT} is not installed: run deploy/setup.sh (Debian package simple-whip-client)")
    return path


@dataclass
class WhipClient:
    process: asyncio.subprocess.Process
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@contextlib.asynccontextmanager
async def publishing(
    url: str, *, video: str | None, audio: str | None, shim: Path, log: Path, token: str | None = None
) -> AsyncIterator[WhipClient]:
    """The client publishing to `url` until the block ends; then SIGTERM, which makes it DELETE
    its resource, and a wait for it to exit."""
    args = [client_path(), "-u", url, "-o"]
    if token is not None:
        args += ["-t", token]
    if video is not None:
        args += ["-V", video]
    if audio is not None:
        args += ["-A", audio]
    env = {**os.environ, "LD_PRELOAD": str(shim)}
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(*args, stdout=out, stderr=subprocess.STDOUT, env=env)
        client = WhipClient(process, log)
        try:
            yield client
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), EXIT_WITHIN_S)
                except TimeoutError:
                    process.kill()
                    await process.wait()
