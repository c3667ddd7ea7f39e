"""GStreamer reader: the optional backend (`backend="gstreamer"`).

RTSP:   rtspsrc (TCP, small jitter buffer) --pad-added--> decodebin per RTP stream
Files / HTTP:  uridecodebin
Either way each decoded pad gets its own branch into an appsink:
  video/x-raw -> videoconvert -> RGB                      -> appsink
  audio/x-raw -> audioconvert -> audioresample -> F32LE 16 kHz mono -> appsink
Anything else (a second video, audio when it is not wanted) goes to a fakesink.

No GLib main loop: the reader thread pulls samples with `try_pull_sample(timeout)` and
pops the bus itself (ERROR / EOS), so it can also watch for `interrupt()` between pulls.
Live appsinks keep only the newest frames (`drop=true`); files apply back-pressure
instead so no frame is lost. `sync=false` everywhere: files are paced by the supervisor.

GStreamer does not notice a frozen RTSP server (the TCP connection stays open): that is
the supervisor's frame watchdog's job. `gi` is imported on first use only.

A packet that does not decode is a corrupt packet, not the end of the stream: every decoder
decodebin plucks (audio and video) gets `max-errors=-1`, so a decode failure is a WARNING
(counted in `corrupt_packets`) and the decoder goes on with the next packet, whatever the
GStreamer version's default (it was 10 before 1.18: the eleventh bad packet ended the file).
A decode ERROR that still reaches the bus after the first frame is counted the same way. Only
errors from elsewhere (the demuxer, the source: the container cannot be read) end the session.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from pipelines.frames import AUDIO_SAMPLE_RATE
from realtime.sources.session import (
    AudioSink,
    BackendUnavailable,
    PacketSink,
    PtsOrigin,
    SessionOptions,
    SourceError,
    VideoSink,
    check_complete,
)
from realtime.sources.spec import SourceSpec

log = logging.getLogger(__name__)

NS = 1_000_000_000
PULL_TIMEOUT_NS = 50_000_000  # how often the reader looks at the bus and the stop flag
AUDIO_CAPS = f"audio/x-raw,format=F32LE,rate={AUDIO_SAMPLE_RATE},channels=1,layout=interleaved"
VIDEO_CAPS = "video/x-raw,format=RGB"
# A local file shows its streams within milliseconds; one that shows none in this long never will.
_FILE_TYPEFIND_S = 5.0
AUDIO_LEAD_S = 0.5  # files: audio may run this far ahead of the video it is muxed with
REQUIRED_ELEMENTS = {
    "rtspsrc": "gstreamer1.0-plugins-good",
    "uridecodebin": "gstreamer1.0-plugins-base",
    "decodebin": "gstreamer1.0-plugins-base",
    "videoconvert": "gstreamer1.0-plugins-base",
    "audioconvert": "gstreamer1.0-plugins-base",
    "audioresample": "gstreamer1.0-plugins-base",
    "appsink": "gstreamer1.0-plugins-base",
}
INSTALL_HINT = (
    "install Debian's gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0 gstreamer1.0-plugins-good "
    "gstreamer1.0-plugins-bad gstreamer1.0-libav, then `pip install 'vidsentry[gstreamer]'` (PyGObject)"
)

_init_lock = threading.Lock()
_gst: Any = None


def load_gstreamer() -> Any:
    """Import and initialise GStreamer once; BackendUnavailable names what is missing."""
    global _gst
    with _init_lock:
        if _gst is not None:
            return _gst
        try:
            import gi

            gi.require_version("Gst", "1.0")
            gi.require_version("GstApp", "1.0")
            from gi.repository import Gst, GstApp  # noqa: F401 - GstApp adds try_pull_sample
        except (ImportError, ValueError) as exc:
            raise BackendUnavailable(f"GStreamer backend unavailable ({exc}): {INSTALL_HINT}") from None
        if not Gst.is_initialized():
            Gst.init(None)
        missing = [
            f"{name} ({package})"
            for name, package in REQUIRED_ELEMENTS.items()
            if Gst.ElementFactory.find(name) is None
        ]
        if missing:
            raise BackendUnavailable(f"GStreamer elements missing: {', '.join(missing)}: {INSTALL_HINT}")
        _gst = Gst
        return Gst


class GstSession:
    def __init__(self, spec: SourceSpec, options: SessionOptions) -> None:
        self._spec = spec
        self._options = options
        self._gst: Any = None
        self._pipeline: Any = None
        self._bus: Any = None
        self._lock = threading.Lock()  # guards the sinks, built on streaming threads
        self._video_sink: Any = None
        self._audio_sink: Any = None
        self._video_ready = threading.Event()
        self._no_more_pads = threading.Event()
        self._any_pad = threading.Event()  # uridecodebin exposed a decoded stream
        self._rtp_video_seen = False
        self._interrupted = threading.Event()
        self._pts = PtsOrigin(rebase=spec.is_network)
        self._last_video_pts: float | None = None
        self._frames = 0
        self._eos = False
        self._pending_audio: Any = None  # a pulled audio sample not yet due (files)
        self.corrupt_packets = 0

    # -- open ---------------------------------------------------------------------------

    def open(self) -> None:
        gst = self._gst = load_gstreamer()
        pipeline = gst.Pipeline.new("vidsentry-source")
        self._pipeline = pipeline
        self._bus = pipeline.get_bus()
        if self._spec.kind == "rtsp":
            source = self._make("rtspsrc")
            source.set_property("location", self._spec.url)
            source.set_property("protocols", "tcp")
            source.set_property("latency", int(self._options.latency_ms))
            source.set_property("drop-on-latency", True)
            source.set_property("tcp-timeout", int(self._options.open_timeout_s * 1_000_000))
            source.set_property("teardown-timeout", 100_000_000)  # ns; don't wait on a dead server
            pipeline.add(source)
            source.connect("pad-added", self._on_rtp_pad)
            source.connect("no-more-pads", lambda *_: self._no_more_pads.set())
        else:
            source = self._make("uridecodebin")
            uri = gst.filename_to_uri(self._spec.url) if self._spec.is_file else self._spec.url
            source.set_property("uri", uri)
            pipeline.add(source)
            source.connect("pad-added", self._on_raw_pad)
            source.connect("no-more-pads", lambda *_: self._no_more_pads.set())
            source.connect("deep-element-added", self._on_element_added)

        if pipeline.set_state(gst.State.PLAYING) == gst.StateChangeReturn.FAILURE:
            self._raise_bus_error(default=f"cannot start reading {self._spec.display}")
        began = time.monotonic()
        deadline = began + self._options.open_timeout_s
        while not self._video_ready.is_set():
            if self._interrupted.is_set():
                raise SourceError("interrupted while connecting")
            message = self._bus.timed_pop_filtered(PULL_TIMEOUT_NS, gst.MessageType.ERROR | gst.MessageType.EOS)
            if message is not None:
                if message.type == gst.MessageType.ERROR:
                    raise SourceError(self._describe_error(message))
                raise SourceError(f"no video stream in {self._spec.display}")
            if self._no_more_pads.is_set() and not self._video_expected():
                # Every stream is exposed and none is video.
                raise SourceError(f"no video stream in {self._spec.display}")
            if self._spec.is_file and not self._any_pad.is_set() and time.monotonic() - began > _FILE_TYPEFIND_S:
                # qtdemux's "no playable streams" on a cut file does not always reach the bus
                # (decodebin can drop it), and then nothing else ever would.
                raise SourceError(f"not a media file or corrupt: {self._spec.display} "
                                  f"(no stream found in it within {_FILE_TYPEFIND_S:g} s)")
            if time.monotonic() > deadline:
                where = self._spec.host_port or self._spec.display
                raise SourceError(f"no video from {where} within {self._options.open_timeout_s:g} s")
        log.debug("gstreamer source opened", extra={"source": self._spec.display})

    def _video_expected(self) -> bool:
        if self._spec.kind == "rtsp":
            return self._rtp_video_seen
        return self._video_ready.wait(0.2)  # uridecodebin: the video pad may still be linking

    def _make(self, factory: str, name: str | None = None) -> Any:
        element = self._gst.ElementFactory.make(factory, name)
        if element is None:
            raise BackendUnavailable(f"GStreamer element {factory} is missing: {INSTALL_HINT}")
        return element

    # -- dynamic linking (runs on GStreamer streaming threads) -----------------------------

    def _on_rtp_pad(self, _source: Any, pad: Any) -> None:
        caps = pad.get_current_caps() or pad.query_caps(None)
        media = caps.get_structure(0).get_value("media") if caps.get_size() else None
        if media == "video":
            self._rtp_video_seen = True
        if media == "video" or (media == "audio" and self._options.want_audio):
            decoder = self._make("decodebin")
            decoder.connect("pad-added", self._on_raw_pad)
            decoder.connect("deep-element-added", self._on_element_added)
            self._add_and_link(pad, [decoder])
        else:
            self._discard(pad)

    @staticmethod
    def _on_element_added(_bin: Any, _sub_bin: Any, element: Any) -> None:
        # A decoder: a packet it cannot decode is skipped with a warning, never the stream's end.
        if element.find_property("max-errors") is not None:
            element.set_property("max-errors", -1)

    def _on_raw_pad(self, _decoder: Any, pad: Any) -> None:
        self._any_pad.set()
        caps = pad.get_current_caps() or pad.query_caps(None)
        kind = caps.get_structure(0).get_name() if caps.get_size() else ""
        with self._lock:
            if kind.startswith("video/x-raw") and self._video_sink is None:
                sink = self._appsink(video=True)
                self._add_and_link(pad, [self._make("videoconvert"), self._capsfilter(VIDEO_CAPS), sink])
                self._video_sink = sink
                self._video_ready.set()
                return
            if kind.startswith("audio/x-raw") and self._options.want_audio and self._audio_sink is None:
                sink = self._appsink(video=False)
                chain = [self._make("audioconvert"), self._make("audioresample"), self._capsfilter(AUDIO_CAPS), sink]
                self._add_and_link(pad, chain)
                self._audio_sink = sink
                return
        self._discard(pad)

    def _appsink(self, *, video: bool) -> Any:
        sink = self._make("appsink")
        live = self._spec.is_network
        # Live: keep the newest (a frozen consumer must not build lag). Files: back-pressure.
        if video:
            sink.set_property("max-buffers", 1 if live else 2)
        else:
            sink.set_property("max-buffers", 200 if live else 50)
        sink.set_property("drop", live)
        sink.set_property("sync", False)
        sink.set_property("enable-last-sample", False)
        sink.set_property("emit-signals", False)
        return sink

    def _capsfilter(self, caps: str) -> Any:
        element = self._make("capsfilter")
        element.set_property("caps", self._gst.Caps.from_string(caps))
        return element

    def _discard(self, pad: Any) -> None:
        sink = self._make("fakesink")
        sink.set_property("sync", False)
        sink.set_property("async", False)
        self._add_and_link(pad, [sink])

    def _add_and_link(self, pad: Any, chain: list[Any]) -> None:
        for element in chain:
            self._pipeline.add(element)
        for upstream, downstream in zip(chain, chain[1:], strict=False):
            upstream.link(downstream)
        for element in reversed(chain):
            element.sync_state_with_parent()
        result = pad.link(chain[0].get_static_pad("sink"))
        if result != self._gst.PadLinkReturn.OK:
            log.warning("cannot link decoded pad", extra={"source": self._spec.display, "result": str(result)})

    # -- run ------------------------------------------------------------------------------

    def run(
        self,
        video_out: VideoSink,
        audio_out: AudioSink | None,
        stop: threading.Event,
        packets_out: PacketSink | None = None,  # GStreamer decodes in its pipeline: no packets to keep
    ) -> None:
        if self._pipeline is None:
            raise SourceError("internal error: run() before open()")
        while not (stop.is_set() or self._interrupted.is_set()):
            self._check_bus()
            with self._lock:
                video_sink, audio_sink = self._video_sink, self._audio_sink
            if audio_sink is not None and not self._pull_audio(audio_sink, audio_out, hold=self._spec.is_file):
                return
            sample = video_sink.try_pull_sample(PULL_TIMEOUT_NS)
            if sample is not None:
                if not self._deliver_video(sample, video_out):
                    return
            elif self._eos or video_sink.is_eos():
                self._finish(video_sink, audio_sink, video_out, audio_out)
                return
            elif self._pending_audio is not None and not self._deliver_audio(audio_out):
                # Video may be starved because the held audio blocks the demuxer: let it go.
                return

    def _finish(self, video_sink: Any, audio_sink: Any, video_out: VideoSink, audio_out: AudioSink | None) -> None:
        """End of stream: hand out what the sinks still hold."""
        while (sample := video_sink.try_pull_sample(0)) is not None:
            if not self._deliver_video(sample, video_out):
                return
        if audio_sink is not None and not self._pull_audio(audio_sink, audio_out, hold=False):
            return
        if self._spec.is_file:
            if self._frames == 0:
                raise SourceError(f"no decodable video in {self._spec.display}")
            check_complete(self._last_video_pts, self._duration())

    def _duration(self) -> float | None:
        ok, duration = self._pipeline.query_duration(self._gst.Format.TIME)
        return duration / NS if ok and duration > 0 else None

    def _check_bus(self) -> None:
        gst = self._gst
        while (message := self._bus.pop()) is not None:  # also drains messages nobody reads
            if message.type == gst.MessageType.ERROR:
                if self._frames > 0 and self._is_decode_error(message):
                    self.corrupt_packets += 1
                    continue
                raise SourceError(self._describe_error(message))
            if message.type == gst.MessageType.EOS:
                self._eos = True
            elif message.type == gst.MessageType.WARNING:
                error, _debug = message.parse_warning()
                if self._is_decode_problem(error) or "decode" in error.message.lower():
                    self.corrupt_packets += 1
                log.debug(
                    "gstreamer warning",
                    extra={"source": self._spec.display, "warning": self._spec.redact(error.message)},
                )

    def _is_decode_error(self, message: Any) -> bool:
        error, _debug = message.parse_error()
        return self._is_decode_problem(error)

    def _is_decode_problem(self, error: Any) -> bool:
        return bool(error.matches(self._gst.StreamError.quark(), int(self._gst.StreamError.DECODE)))

    def _pull_audio(self, sink: Any, audio_out: AudioSink | None, *, hold: bool) -> bool:
        """Hand out the audio that is due. Files (`hold`): audio more than AUDIO_LEAD_S ahead
        of the video stays in the appsink, so audio and video leave interleaved (as from a
        demuxer) and real-time pacing of the video paces the audio too."""
        while True:
            if self._pending_audio is None:
                self._pending_audio = sink.try_pull_sample(0)
                if self._pending_audio is None:
                    return True
            if hold and self._audio_time(self._pending_audio) > (self._last_video_pts or 0.0) + AUDIO_LEAD_S:
                return True
            if not self._deliver_audio(audio_out):
                return False

    def _audio_time(self, sample: Any) -> float:
        return self._buffer_time(sample.get_buffer(), None)

    def _deliver_audio(self, audio_out: AudioSink | None) -> bool:
        sample, self._pending_audio = self._pending_audio, None
        if sample is None or audio_out is None:
            return True
        buffer = sample.get_buffer()
        samples = np.frombuffer(buffer.extract_dup(0, buffer.get_size()), dtype=np.float32).copy()
        return audio_out(samples, self._buffer_time(buffer, None), time.time())

    def _deliver_video(self, sample: Any, video_out: VideoSink) -> bool:
        buffer = sample.get_buffer()
        structure = sample.get_caps().get_structure(0)
        width = structure.get_value("width")
        height = structure.get_value("height")
        data = np.frombuffer(buffer.extract_dup(0, buffer.get_size()), dtype=np.uint8)
        stride = data.size // height  # rows are padded to 4 bytes
        image = data.reshape(height, stride)[:, : width * 3].reshape(height, width, 3).copy()
        captured_at = time.time()
        pts = self._buffer_time(buffer, self._last_video_pts)
        self._last_video_pts = pts
        self._frames += 1
        return video_out(image, pts, captured_at)

    def _buffer_time(self, buffer: Any, previous: float | None) -> float:
        if buffer.pts == self._gst.CLOCK_TIME_NONE:
            return previous if previous is not None else 0.0
        return self._pts(buffer.pts / NS)

    # -- errors ---------------------------------------------------------------------------

    def _raise_bus_error(self, default: str) -> None:
        message = self._bus.timed_pop_filtered(NS, self._gst.MessageType.ERROR)
        raise SourceError(self._describe_error(message) if message is not None else default)

    def _describe_error(self, message: Any) -> str:
        error, debug = message.parse_error()
        text = f"{error.message} {debug or ''}"
        lowered = text.lower()
        where = self._spec.host_port or self._spec.display
        if "connection refused" in lowered:
            reason = f"connection refused by {where}"
        elif "failed to connect" in lowered:
            reason = f"cannot connect to {where} (refused or unreachable)"
        elif "401" in text or "unauthorized" in lowered:
            reason = f"access denied by {where} (check the user name and password)"
        elif self._spec.is_network and ("404" in text or "not found" in lowered):
            reason = f"stream not found: {self._spec.display}"
        elif "timeout" in lowered or "timed out" in lowered:
            reason = f"no answer from {where} within {self._options.open_timeout_s:g} s"
        elif self._spec.is_file and ("type" in lowered or "demux" in lowered or "decode" in lowered):
            reason = f"not a media file or corrupt: {self._spec.display} ({error.message})"
        else:
            reason = f"{error.message} ({where})"
        return self._spec.redact(" ".join(reason.split()))

    # -- interrupt / close ----------------------------------------------------------------

    def interrupt(self) -> None:
        self._interrupted.set()

    def close(self) -> None:
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.set_state(self._gst.State.NULL)
        with self._lock:
            self._video_sink = self._audio_sink = None
        self._bus = None
