"""PyAV (FFmpeg) reader: the default backend for files, RTSP and HTTP sources.

Network sources are opened over TCP with two independent time limits, because FFmpeg
never gives up on a silent peer by itself: the socket option `timeout` (µs) and PyAV's
interrupt callback `timeout=(open_s, read_s)`. When the read limit fires, the RTSP demuxer
first hands out what it still buffers (one last frame) and the next read fails after another
read limit; the supervisor's watchdog is shorter than both, so it reports the stall first.
Whatever error FFmpeg then gives ("Invalid data found ..."), a read that failed after
a silence is reported as the silence. Neither limit can be cut short from
another thread, so `interrupt()` takes effect at the next packet; the supervisor does
not wait for a hung read (it abandons the session, which ends at its timeout).

Packets that fail to decode are skipped and counted (`corrupt_packets`) rather than
ending the session, whatever error the decoder gives: FFmpeg's decoders report damaged input
with many codes (the AAC decoder says EPERM, "Operation not permitted", for some corrupt
frames; H.264 says EINVAL or AVERROR_INVALIDDATA), so every FFmpegError from decoding one
packet counts as one corrupt packet, on either track. Only the demuxer can end a session
with an error: a container that cannot be read any further is unreadable, a packet that
cannot be decoded is not. Each track keeps its own run of consecutive failures: a run of
MAX_CONSECUTIVE_CORRUPT video packets with no good frame between ends the session (nothing
useful is coming), the same run of audio packets stops decoding the audio for the rest of the
session (logged once) while the video goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import av
import av.error

from engines.media.remux import CodecHeader, EncodedPacket
from pipelines.frames import AUDIO_SAMPLE_RATE
from realtime.sources.decode import (
    DecoderChoice,
    DecodeUnavailable,
    decode_mode,
    deferred_rgb,
    open_input,
    select_decoder,
)
from realtime.sources.session import (
    AudioSink,
    PacketSink,
    PtsOrigin,
    SessionOptions,
    SourceError,
    VideoSink,
    check_complete,
)
from realtime.sources.spec import SourceSpec

log = logging.getLogger(__name__)

# This many undecodable packets of one track in a row, with no good frame between: the video
# ends the session, the audio is dropped for the rest of it.
MAX_CONSECUTIVE_CORRUPT = 300
RTSP_ANALYZE_US = 500_000  # probe half a second of stream: first frame in well under 1 s


class PyAVSession:
    def __init__(self, spec: SourceSpec, options: SessionOptions) -> None:
        self._spec = spec
        self._options = options
        self._container: Any = None
        self._video: Any = None
        self._audio: Any = None
        self._resampler: av.AudioResampler | None = None
        self._interrupted = threading.Event()
        self._pts = PtsOrigin(rebase=spec.is_network)
        self._last_video_pts: float | None = None
        self._header: CodecHeader | None = None  # this connection's codec parameters, for clips
        self._last_packet_pts: float | None = None
        self._consecutive_corrupt = {"video": 0, "audio": 0}
        self._frames = 0
        self._last_packet_at = time.monotonic()
        self.corrupt_packets = 0
        self.decoder: DecoderChoice | None = None

    # -- open ---------------------------------------------------------------------------

    def open(self) -> None:
        options: dict[str, str] = {}
        timeout: tuple[float, float] | None = None
        if self._spec.is_network:
            options["timeout"] = str(int(self._options.read_timeout_s * 1_000_000))
            timeout = (self._options.open_timeout_s, self._options.read_timeout_s)
        if self._spec.kind == "rtsp":
            options["rtsp_transport"] = "tcp"
            options["analyzeduration"] = str(RTSP_ANALYZE_US)
        try:
            container = open_input(self._spec.url, self._decoder(), options=options, timeout=timeout)
        except av.error.FFmpegError as exc:
            raise SourceError(self._spec.redact(self._describe_open_error(exc))) from None
        self._container = container
        if not container.streams.video:
            raise SourceError(f"no video stream in {self._spec.display}")
        video = container.streams.video[0]
        if video.codec_context is None:
            raise SourceError(f"unsupported video codec in {self._spec.display}")
        if self._spec.is_file:
            video.thread_type = "AUTO"  # throughput over latency for files
        self._video = video
        if self._options.want_audio and container.streams.audio:
            audio = container.streams.audio[0]
            if audio.codec_context is not None:
                self._audio = audio
                self._resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_SAMPLE_RATE)
        log.debug(
            "pyav source opened",
            extra={
                "source": self._spec.display,
                "video_codec": video.codec_context.name,
                "decoder": self.decoder.device if self.decoder is not None else None,
                "audio_codec": self._audio.codec_context.name if self._audio is not None else None,
            },
        )

    def _decoder(self) -> DecoderChoice:
        # NVDEC or CPU (realtime/sources/decode.py); frames reach the sink as RGB arrays either way.
        try:
            self.decoder = select_decoder(decode_mode())
        except (ValueError, DecodeUnavailable) as exc:
            raise SourceError(str(exc)) from None
        return self.decoder

    def _describe_open_error(self, exc: av.error.FFmpegError) -> str:
        what = exc.strerror or type(exc).__name__
        where = self._spec.host_port or self._spec.display
        if isinstance(exc, av.error.ConnectionRefusedError):
            return f"connection refused by {where}"
        if isinstance(exc, av.error.ExitError | av.error.TimeoutError):
            return f"no answer from {where} within {self._options.open_timeout_s:g} s"
        if isinstance(exc, av.error.HTTPUnauthorizedError | av.error.HTTPForbiddenError):
            return f"access denied by {where} (check the user name and password): {what}"
        if isinstance(exc, av.error.HTTPNotFoundError):
            return f"stream not found: {self._spec.display}"
        if isinstance(exc, av.error.InvalidDataError) and self._spec.is_file:
            return f"not a media file or corrupt: {self._spec.display} ({what})"
        if isinstance(exc, av.error.PermissionError):
            return f"permission denied: {self._spec.display}"
        return f"cannot open {self._spec.display}: {what}"

    # -- run ----------------------------------------------------------------------------

    def run(
        self,
        video_out: VideoSink,
        audio_out: AudioSink | None,
        stop: threading.Event,
        packets_out: PacketSink | None = None,
    ) -> None:
        if self._container is None:
            raise SourceError("internal error: run() before open()")
        streams = [self._video] if self._audio is None or audio_out is None else [self._video, self._audio]
        self._last_packet_at = time.monotonic()
        try:
            for packet in self._container.demux(streams):
                self._last_packet_at = time.monotonic()
                if stop.is_set() or self._interrupted.is_set():
                    return
                if packet.stream is self._video:
                    if packets_out is not None:
                        self._keep(packet, packets_out)
                    if not self._decode_video(packet, video_out):
                        return
                elif audio_out is not None and self._audio is not None and not self._decode_audio(packet, audio_out):
                    return
        except av.error.FFmpegError as exc:
            if stop.is_set() or self._interrupted.is_set():
                return
            raise SourceError(self._spec.redact(self._describe_read_error(exc))) from None
        if self._frames == 0 and self._spec.is_file:
            raise SourceError(f"no decodable video in {self._spec.display}")
        if self._spec.is_file:
            duration = self._container.duration
            check_complete(self._last_video_pts, duration / 1_000_000 if duration is not None else None)

    def _describe_read_error(self, exc: av.error.FFmpegError) -> str:
        what = exc.strerror or type(exc).__name__
        quiet = time.monotonic() - self._last_packet_at
        timed_out = isinstance(exc, av.error.ExitError | av.error.TimeoutError)
        if self._spec.is_network and (timed_out or quiet >= 0.9 * self._options.read_timeout_s):
            return f"no data from {self._spec.host_port} for {quiet:.1f} s"
        return f"read error: {what}"

    def _keep(self, packet: Any, packets_out: PacketSink) -> None:
        """Hand the encoded packet on as it came (a copy of its bytes), in the frames' timeline;
        from this connection's first keyframe, which also fixes its codec header."""
        if not packet.size:
            return
        if self._header is None:
            if not packet.is_keyframe:
                return
            self._header = CodecHeader.from_stream(self._video, packet)
        time_base = packet.time_base
        if packet.pts is not None and time_base is not None:
            self._last_packet_pts = self._pts(float(packet.pts * time_base))
        elif self._last_packet_pts is not None:  # RTSP's first packets come without a timestamp
            self._last_packet_pts += float((packet.duration or 0) * (time_base or 0))
        else:
            self._last_packet_pts = 0.0
        packets_out(self._last_packet_pts, EncodedPacket.from_av(packet, self._header))

    def _decode_video(self, packet: Any, video_out: VideoSink) -> bool:
        frames = self._decode(packet, "video")
        if self._consecutive_corrupt["video"] >= MAX_CONSECUTIVE_CORRUPT:
            raise SourceError(
                f"stream is corrupt: {self._consecutive_corrupt['video']} video packets in a row did not decode"
            )
        for frame in frames:
            image = deferred_rgb(frame)
            captured_at = time.time()
            pts = self._frame_time(frame)
            self._frames += 1
            if not video_out(image, pts, captured_at):
                return False
        return True

    def _frame_time(self, frame: Any) -> float:
        t = frame.time
        if t is None:  # no timestamp: continue from the last one at the nominal rate
            rate = self._video.average_rate or 25
            previous = self._last_video_pts
            pts = 0.0 if previous is None else previous + 1.0 / float(rate)
        else:
            pts = self._pts(float(t))
        self._last_video_pts = pts
        return pts

    def _decode_audio(self, packet: Any, audio_out: AudioSink) -> bool:
        assert self._resampler is not None
        frames = self._decode(packet, "audio")
        if self._consecutive_corrupt["audio"] >= MAX_CONSECUTIVE_CORRUPT:
            # The audio track is beyond use; the video is not: stop decoding audio, keep going.
            log.warning(
                "audio track undecodable, dropping it for this session",
                extra={"source": self._spec.display, "corrupt_packets": self.corrupt_packets},
            )
            self._audio = None
            return True
        for frame in frames:
            t = frame.time
            try:
                chunks = self._resampler.resample(frame)
            except (av.error.FFmpegError, ValueError):
                self.corrupt_packets += 1
                continue
            for chunk in chunks:
                samples = chunk.to_ndarray().reshape(-1)
                pts = self._pts(float(chunk.time if chunk.time is not None else t or 0.0))
                if not audio_out(samples, pts, time.time()):
                    return False
        return True

    def _decode(self, packet: Any, track: str) -> list[Any]:
        """The packet's frames; none when it does not decode (counted). Any decoder error is the
        packet's, never the session's: see the module docstring."""
        corrupt = bool(packet.is_corrupt)
        try:
            frames: list[Any] = packet.decode()
        except av.error.FFmpegError as exc:
            frames, corrupt = [], True
            error = exc.strerror or type(exc).__name__
        else:
            error = "flagged corrupt by the demuxer"
        if frames:
            self._consecutive_corrupt[track] = 0
        if corrupt:
            self.corrupt_packets += 1
            self._consecutive_corrupt[track] += 1
            run = self._consecutive_corrupt[track]
            if run == 1 or run % 100 == 0:
                log.info(
                    "skipping undecodable packet",
                    extra={
                        "source": self._spec.display,
                        "track": track,
                        "error": error,
                        "corrupt_packets": self.corrupt_packets,
                    },
                )
        return frames

    # -- interrupt / close ----------------------------------------------------------------

    def interrupt(self) -> None:
        self._interrupted.set()

    def close(self) -> None:
        container, self._container = self._container, None
        if container is not None:
            try:
                container.close()
            except av.error.FFmpegError as exc:  # closing a broken connection can complain
                log.debug("error closing pyav source", extra={"source": self._spec.display, "error": str(exc)})
