"""The Watch view's live video (WHEP), live: frames shown per second against the camera's rate,
glass-to-glass latency, and what each viewer costs the service.

`vidsentry serve` runs as a user runs it (a subprocess, the sample config's stages: detection,
tracking, rules, captions, timeline) with one RTSP camera: the GStreamer RTSP server of
tests/support playing the sample clip (H.264 768x576 at 10 fps, AAC narration) in real time.
Headless Chromium (Debian's, through playwright) opens the page's Watch view on that camera:
first no viewer, then 1, then `--viewers` (4) pages at once, each phase `--window` seconds.

Per phase:
  shown_ratio        frames the page presented (requestVideoFrameCallback) per second, divided by
                     the camera's 10 fps, averaged over the viewers
  g2g_p50/p95_ms     a frame's glass-to-glass latency: when the page showed it (the frame's
                     expectedDisplayTime) minus the time the service received it (its detections'
                     captured_at, found by the frame's pts through the RTP clock); the page holds
                     frames back until their boxes are there, so this includes that hold
  matched            share of shown frames whose own detections were drawn on them
  input_fps          frames that reached the service per second (a peer on a loaded machine may send
                     fewer than 10)
  detected_fps       frames the camera's frame loop processed per second (the compute budget gives
                     detection what the cores have left: a viewer's cost shows here too)
  serve_cpu          cores the serve process used (its utime+stime over the window)
  encoder_cpu        cores the stream's live encoder used (0 for a forwarded camera)
  encoder_skipped    frames the live encoder skipped in the window (busy with an earlier one)
  cpu_per_viewer     (serve_cpu - serve_cpu with no viewer - encoder_cpu) / viewers
  chromium_cpu       cores the browser's processes used (decoding and drawing: the client's cost)

Camera-to-service time (the RTSP server's own pipeline and the network) is not in g2g: the service
only knows when a frame reached it. The machine may be shared: loadavg is printed beside the figures.

`--source` picks what is watched:
  rtsp       the camera above: its H.264 packets are forwarded, nothing is encoded (the default)
  gstreamer  the same camera read with `ingest: gstreamer`, which decodes inside its pipeline: no
             packets, so its frames are encoded for the viewers (realtime.webrtc.live_encode)
  mpeg4      the sample vtest.avi (MS MPEG-4 v3, 768x576, 10 fps) as a camera: encoded too
  peer       a browser session (an aiortc peer in this process sending the sample clip's frames as
             VP8 at 10 fps): encoded too
For an encoded source, encoder_cpu is the cores the stream's live encoder used (its thread CPU
time, `live_encode_cpu_s`): the cost per stream, whatever the number of viewers; cpu_per_viewer
then leaves it out.

Usage: python bench/bench_live_view.py [--source rtsp] [--window 12] [--viewers 4] [--detect-fps 1] [--isolate]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import yaml
from _common import ROOT, ensure_sample, pct, table, write_results
from playwright.async_api import Browser, Page, async_playwright

from tests.support.peer import Peer, connect, load_frames
from tests.support.rtsp import RtspServer
from tests.support.serve_process import ServeProcess, http, write_config

CAMERA_FPS = 10.0
CHROMIUM = "/usr/bin/chromium"
TICKS = os.sysconf("SC_CLK_TCK")
SOURCES = ("rtsp", "gstreamer", "mpeg4", "peer")
VTEST = ROOT / ".cache" / "samples" / "vtest.avi"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def browser_cpu_seconds() -> float:
    """CPU seconds of the Chromium processes under this one (playwright's driver starts them):
    the browser, its renderers and GPU process; other users' browsers are not counted."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith("chrom"):
                total += cpu_seconds(pid)
        except OSError:
            continue
        todo += children.get(pid, [])
    return total


def serve_config(camera: str, source: str, port: int, detect_fps: float | None, isolate: bool) -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "samples" / "vidsentry.yaml").read_text())
    if isolate:  # what varies with the scene and the narration off, so that the viewers' cost shows
        config["captions"]["enabled"] = False
        config["timeline"]["enabled"] = False
        detect_fps = 1.0
    config["http"]["port"] = port
    config["webrtc"]["allow_local_candidates"] = True  # the browser is on this machine
    config["webrtc"]["max_viewers"] = 16
    if source == "peer":  # the stream is the session the peer opens
        config["streams"] = []
    elif source == "mpeg4":
        config["streams"] = [{"id": "plaza", "url": str(VTEST), "realtime": True, "audio": False,
                              "detect_fps": detect_fps}]
    else:
        config["streams"] = [{"id": "plaza", "url": camera, "audio": True, "detect_fps": detect_fps,
                              "ingest": "gstreamer" if source == "gstreamer" else "pyav"}]
    return config


async def open_viewer(browser: Browser, url: str, stream_id: str) -> Page:
    context = await browser.new_context(viewport={"width": 1100, "height": 760})
    page = await context.new_page()
    await page.goto(url + "/#watch")
    await page.click(f".stream[data-id={stream_id}]")
    await page.wait_for_selector("#watch-live.on", timeout=20_000)
    await page.wait_for_selector('#watch-overlay:not([data-frames="0"])', timeout=20_000)
    return page


async def hooks(page: Page) -> dict[str, Any]:
    watch: dict[str, Any] = await page.evaluate("window.vidsentry.watch")
    return watch


async def phase(serve: ServeProcess, stream_id: str, pages: list[Page], window: float) -> dict[str, Any]:
    before = [await hooks(page) for page in pages]
    processed_before, encoder_before, skipped_before, in_before = counters(serve, stream_id)
    serve_before, browser_before, began = cpu_seconds(serve.pid), browser_cpu_seconds(), time.monotonic()
    await asyncio.sleep(window)
    after = [await hooks(page) for page in pages]
    elapsed = time.monotonic() - began
    serve_cpu = (cpu_seconds(serve.pid) - serve_before) / elapsed
    browser_cpu = (browser_cpu_seconds() - browser_before) / elapsed
    processed_after, encoder_after, skipped_after, in_after = counters(serve, stream_id)
    detected_fps = (processed_after - processed_before) / elapsed
    encoder_cpu = (encoder_after - encoder_before) / elapsed
    ratios: list[float] = []
    latencies: list[float] = []
    matched = shown = 0
    for first, last in zip(before, after, strict=True):
        frames = last["videoFrames"] - first["videoFrames"]
        ratios.append(frames / elapsed / CAMERA_FPS)
        shown += frames
        matched += last["matched"] - first["matched"]
        # latenciesMs is bounded (the newest 2000): the window's are the ones added after `first`'s.
        added = len(last["latenciesMs"]) - len(first["latenciesMs"])
        latencies += last["latenciesMs"][-added:] if added > 0 else []
    return {
        "viewers": len(pages),
        "shown_ratio": round(sum(ratios) / len(ratios), 3) if ratios else None,
        "g2g_p50_ms": pct(latencies, 50),
        "g2g_p95_ms": pct(latencies, 95),
        "matched": round(matched / shown, 3) if shown else None,
        "hold_ms": round(max((a["holdMs"] for a in after), default=0)),
        "input_fps": round((in_after - in_before) / elapsed, 2),
        "detected_fps": round(detected_fps, 2),
        "serve_cpu": round(serve_cpu, 3),
        "encoder_cpu": round(encoder_cpu, 3),
        "encoder_skipped": skipped_after - skipped_before,
        "chromium_cpu": round(browser_cpu, 3),
        "loadavg": os.getloadavg()[0],
    }


def counters(serve: ServeProcess, stream_id: str) -> tuple[int, float, int, int]:
    """Frames the stream's frame loop has processed (measured or predicted boxes), the CPU seconds
    its live encoder has used, the frames it skipped, and the frames that reached the service."""
    assert serve.url is not None
    body = http("GET", serve.url + f"/api/streams/{stream_id}")[1]["counters"]
    return (int(body["frames_processed"]), float(body.get("live_encode_cpu_s", 0.0)),
            int(body.get("live_frames_skipped", 0)), int(body.get("frames_in", 0)))


async def until_live(url: str, stream_id: str, within_s: float = 60.0) -> None:
    """Polled without blocking the loop: a peer in this process must go on connecting meanwhile."""
    deadline = time.monotonic() + within_s
    while http("GET", url + f"/api/streams/{stream_id}")[1].get("state") != "live":
        if time.monotonic() > deadline:
            raise AssertionError(f"{stream_id} not live within {within_s} s")
        await asyncio.sleep(0.2)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    clip = ensure_sample()
    result: dict[str, Any] = {"source": args.source, "camera_fps": CAMERA_FPS, "window_s": args.window,
                              "detect_fps": args.detect_fps, "isolate": args.isolate,
                              "loadavg_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp, RtspServer(clip=clip, log_path=Path(tmp) / "rtsp.log") as rtsp:
        settings = serve_config(rtsp.url("/vtest"), args.source, free_port(), args.detect_fps, args.isolate)
        config = write_config(Path(tmp) / "vidsentry.yaml", settings)
        with ServeProcess("--config", str(config), log_dir=Path(tmp)).start() as serve:
            assert serve.url is not None
            url = serve.url
            async with aiohttp.ClientSession() as session, async_playwright() as playwright:
                peer: Peer | None = None
                stream_id = "plaza"
                if args.source == "peer":
                    frames = load_frames(clip, start=0, count=100, size=(768, 576))
                    peer = await connect(session, url, frames=frames, fps=CAMERA_FPS)
                    stream_id = peer.stream_id
                await until_live(url, stream_id)
                browser = await playwright.chromium.launch(executable_path=CHROMIUM,
                                                           args=["--headless=new", "--no-sandbox"])
                try:
                    await asyncio.sleep(args.warmup)  # models warm, captions running
                    phases = [await phase(serve, stream_id, [], args.window)]
                    print(phases[-1], flush=True)
                    pages = [await open_viewer(browser, url, stream_id)]
                    await asyncio.sleep(2)  # past the first keyframe and the hold settling
                    phases.append(await phase(serve, stream_id, pages, args.window))
                    print(phases[-1], flush=True)
                    pages += [await open_viewer(browser, url, stream_id) for _ in range(args.viewers - 1)]
                    await asyncio.sleep(2)
                    phases.append(await phase(serve, stream_id, pages, args.window))
                    print(phases[-1], flush=True)
                finally:
                    await browser.close()
                    if peer is not None:
                        await peer.close()
    idle = phases[0]["serve_cpu"]
    for row in phases[1:]:
        row["cpu_per_viewer"] = round((row["serve_cpu"] - idle - row["encoder_cpu"]) / row["viewers"], 3)
    result["phases"] = phases
    result["loadavg_after"] = os.getloadavg()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=SOURCES, default="rtsp",
                        help="what is watched: the H.264 camera forwarded, or a stream encoded for viewers "
                             "(the camera read by GStreamer, the MPEG-4 sample, a browser session)")
    parser.add_argument("--window", type=float, default=12.0, help="seconds each phase is measured")
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--viewers", type=int, default=4)
    parser.add_argument("--detect-fps", type=float, default=None,
                        help="the camera's detect_fps (default: every frame); a low one leaves cores idle, so "
                             "serve's CPU shows what the viewers add")
    parser.add_argument("--isolate", action="store_true",
                        help="captions and the timeline off, detect_fps 1: serve's own load steady and small, so "
                             "its CPU with 0, 1 and 4 viewers shows what the viewers cost")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    columns = ["viewers", "shown_ratio", "g2g_p50_ms", "g2g_p95_ms", "matched", "hold_ms", "input_fps", "detected_fps",
               "serve_cpu", "encoder_cpu", "encoder_skipped", "cpu_per_viewer", "chromium_cpu", "loadavg"]
    print()
    print(table(result["phases"], columns))
    print(f"\nloadavg before {result['loadavg_before']}, after {result['loadavg_after']} (a shared machine)")
    name = "live_view_isolated" if args.isolate else "live_view"
    name += "" if args.source == "rtsp" else f"_{args.source}"
    name += "" if args.detect_fps is None else f"_detect{args.detect_fps:g}"
    print(f"written {write_results(name, result)}")


if __name__ == "__main__":
    main()
