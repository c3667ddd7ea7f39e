"""A real RTSP server for tests (GStreamer's gst-rtsp-server), run as its own process.

    python tests/support/rtsp_server.py --port 0 [--clip sample.mp4]

Mounts:
  /vtest  the clip's own H.264 + AAC, passed through without re-encoding (qtdemux ->
          h264parse / aacparse -> RTP), in real time, once (79.5 s for the sample clip).
          One media per client, so every client starts at the first keyframe.
  /test   an endless live source: videotestsrc -> x264 (zerolatency) + audiotestsrc -> Opus.
  /resize as /test, but the picture switches between 320x240 and 480x360 every --resize-every
          seconds (a camera whose stream is reconfigured): one media per client.

Listens on 127.0.0.1 only and prints "READY <port>" once it accepts connections (port 0
picks a free one). SIGTERM / SIGINT stop it cleanly; tests also SIGKILL / SIGSTOP it.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

LIVE_TEST_LAUNCH = (
    "( videotestsrc is-live=true pattern=ball "
    "! video/x-raw,width=320,height=240,framerate=15/1 "
    "! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=15 bitrate=400 "
    "! rtph264pay name=pay0 pt=96 config-interval=1 "
    "audiotestsrc is-live=true wave=sine freq=440 "
    "! audio/x-raw,rate=48000,channels=1 ! audioconvert ! opusenc ! rtpopuspay name=pay1 pt=97 )"
)


RESIZE_SIZES = ((320, 240), (480, 360))
RESIZE_LAUNCH = (
    "( videotestsrc is-live=true pattern=ball ! videoscale "
    "! capsfilter name=size caps=video/x-raw,width=320,height=240,framerate=15/1 "
    "! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=15 bitrate=400 "
    "! rtph264pay name=pay0 pt=96 config-interval=1 "
    "audiotestsrc is-live=true wave=sine freq=660 "
    "! audio/x-raw,rate=48000,channels=1 ! audioconvert ! opusenc ! rtpopuspay name=pay1 pt=97 )"
)


def resize_every(factory: GstRtspServer.RTSPMediaFactory, seconds: float) -> None:
    """Each client's media switches its picture size every `seconds` until it is torn down."""

    def configure(_factory: Any, media: GstRtspServer.RTSPMedia) -> None:
        size = media.get_element().get_by_name("size")
        turn = [0]

        def switch() -> bool:
            if media.get_status() in (GstRtspServer.RTSPMediaStatus.UNPREPARED, GstRtspServer.RTSPMediaStatus.ERROR):
                return GLib.SOURCE_REMOVE
            turn[0] += 1
            width, height = RESIZE_SIZES[turn[0] % len(RESIZE_SIZES)]
            size.set_property("caps", Gst.Caps.from_string(f"video/x-raw,width={width},height={height},framerate=15/1"))
            return GLib.SOURCE_CONTINUE

        GLib.timeout_add(int(seconds * 1000), switch)

    factory.connect("media-configure", configure)


def clip_launch(clip: Path) -> str:
    location = str(clip).replace("\\", "\\\\").replace('"', '\\"')
    return (
        f'( filesrc location="{location}" ! qtdemux name=demux '
        "demux.video_0 ! queue ! h264parse ! rtph264pay name=pay0 pt=96 config-interval=1 "
        "demux.audio_0 ! queue ! aacparse ! rtpmp4gpay name=pay1 pt=97 )"
    )


def build_server(port: int, clip: Path | None, resize_s: float = 60.0) -> GstRtspServer.RTSPServer:
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(port))
    mounts = server.get_mount_points()

    live = GstRtspServer.RTSPMediaFactory()
    live.set_launch(LIVE_TEST_LAUNCH)
    live.set_shared(True)
    mounts.add_factory("/test", live)

    resizing = GstRtspServer.RTSPMediaFactory()
    resizing.set_launch(RESIZE_LAUNCH)
    resizing.set_shared(False)
    resize_every(resizing, resize_s)
    mounts.add_factory("/resize", resizing)

    if clip is not None:
        vtest = GstRtspServer.RTSPMediaFactory()
        vtest.set_launch(clip_launch(clip))
        vtest.set_shared(False)
        mounts.add_factory("/vtest", vtest)
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--clip", type=Path, help="H.264 + AAC mp4 served on /vtest")
    parser.add_argument("--resize-every", type=float, default=60.0, help="seconds between /resize's size switches")
    args = parser.parse_args(argv)
    if args.clip is not None and not args.clip.is_file():
        parser.error(f"no such clip: {args.clip}")

    Gst.init(None)
    server = build_server(args.port, args.clip, args.resize_every)
    main_loop = GLib.MainLoop()
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr)
        return 1

    def quit_loop(*_: Any) -> bool:
        main_loop.quit()
        return GLib.SOURCE_REMOVE

    # A Python signal handler would never run while the GLib loop blocks in C.
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, quit_loop)
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGINT, quit_loop)
    print(f"READY {server.get_bound_port()}", flush=True)
    main_loop.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
