"""The clips stage: keeps a stream's encoded packets and cuts a clip around each alert.

An alert's clip spans its start − `pre_s` (from the keyframe at or before it) to its end +
`post_s`; alerts whose spans overlap on one stream share one clip, and a clip is cut at `max_s`
even while its alert goes on (the next one continues from there). The stream's newest frame says
how far its media time has come, so a clip is cut once its end is in the buffer; when the stream
ends, what is pending is cut from what the buffer holds. A span no longer in the buffer is
counted (`clips_missed`), as is a clip the disk refused (`clips_failed`).

A source that hands no encoded packets (a browser session, GStreamer ingest) has its frames
encoded here (engines.media.encode), each in a background turn of the compute budget: the models
go first. While the budget is short only `SHORT_FPS` frames a second are encoded; the frames
passed over are counted (`clip_frames_skipped`), so a clip of a loaded machine plays at a lower
frame rate instead of taking the recognizer's or the detector's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cv2

from engines.media.encode import FrameEncoder
from engines.media.remux import EncodedPacket, RemuxError, still_at
from pipelines.clips.engine import CLIPS, ClipEngine
from pipelines.clips.ring import PacketRing
from pipelines.clips.store import ClipInfo
from pipelines.compute import ComputeBudget, ModelClaim, Priority
from pipelines.errors import PipelineError
from pipelines.event_bodies import AlertBody, CaptionBody, DescriptionBody, DetectionsBody, search_number
from pipelines.events import Delivery, Event, EventBody, EventSink, Findable, KindSpec
from pipelines.frames import VideoFrame
from pipelines.graph import StageContext, counter, gauge, register_counters
from pipelines.graph.counters import Counters
from pipelines.mailbox import FrameMailbox, MailboxClosed
from pipelines.tasks import wait_set

log = logging.getLogger(__name__)

STAGE_NAME = "clips"
MAX_FPS = 60  # bounds the boxes and captions kept per second of buffer
MAX_ALERT_EVENTS = 256  # alert starts and ends kept for the package (an alert's start may be long past)
ALERT_FIELDS = ("alert_id", "rule_id", "rule_type", "event", "severity", "class", "track_ids", "evidence",
                "snapshot", "started_pts", "ended_pts", "duration_s")
STILL_QUALITY = 85  # JPEG quality of a picture decoded from the buffer (frame.jpg?pts=)
ENCODER = "clip encoder"  # a decoded source's frames encoded for its clips, in the compute budget
SHORT_FPS = 5.0  # frames a second still encoded for clips while the compute budget is short
# When the stream ends, the detector may publish the ends of its open alerts just after the frames
# stop: the last clips wait this long for them, so their package has each alert's end.
FINAL_ALERTS_WAIT_S = 2.0

register_counters(
    {
        "clips": counter("Clips written around alerts"),
        "clips_failed": counter("Clips the disk refused"),
        "clips_missed": counter("Clips whose span had already left the packet buffer"),
        "clip_packets": counter("Encoded video packets kept for clips"),
        "clip_gops_dropped": counter("Groups of pictures aged out of the clip buffer"),
        "clip_buffer_bytes": gauge("Bytes of encoded video in the clip buffer"),
        "clip_stills": counter("Pictures decoded from the clip buffer (frame.jpg?pts=)"),
        "clip_frames_encoded": counter("Decoded frames encoded for clips (sources without packets of their own)"),
        "clip_frames_skipped": counter("Decoded frames not encoded for clips: the compute budget was short"),
    },
    section="clips",
)


class ExportRefused(PipelineError, ValueError):
    """A span that cannot be cut into a clip; the message says why."""


@dataclass
class Window:
    start: float  # media seconds (pts)
    end: float | None  # None while an alert in it is open
    alert_ids: list[str] = field(default_factory=list)
    open_alerts: set[str] = field(default_factory=set)
    tracks: set[int] = field(default_factory=set)  # the tracks its alerts are about


class ClipStage:
    name = STAGE_NAME

    def __init__(self, stream_id: str, engine: ClipEngine, ring: PacketRing, frames: FrameMailbox,
                 sink: EventSink, *, encoder: FrameEncoder | None = None,
                 compute: ComputeBudget | None = None) -> None:
        self.stream_id = stream_id
        self.engine = engine
        self.ring = ring
        self.frames = frames
        self.sink = sink
        self.windows: list[Window] = []
        # What each clip's span showed and said, for its extras: every frame's objects (measured or
        # predicted) and the final captions, kept as long as the packets (bounded by count too).
        limit = int(engine.settings.buffer_s * MAX_FPS)
        self.boxes: deque[tuple[float, DetectionsBody]] = deque(maxlen=limit)
        self.captions: deque[tuple[float, float, str]] = deque(maxlen=limit)
        # And what was said of it: the descriptions (with the VLM's fields) and the alerts' starts
        # and ends (their evidence, a `vlm` check's reason, the snapshot), for the clip's package.
        self.descriptions: deque[dict[str, Any]] = deque(maxlen=limit)
        self.alert_events: deque[dict[str, Any]] = deque(maxlen=MAX_ALERT_EVENTS)
        self.written = 0
        self.failed = 0
        self.missed = 0
        self.stills = 0
        # Set for a source without packets of its own: its frames are encoded into the ring here.
        self.encoder = encoder
        self.compute = compute
        if compute is not None and encoder is not None:
            compute.add(ENCODER, ModelClaim(Priority.BACKGROUND))
        self.encoded = 0
        self.skipped = 0
        self._last_encoded: float | None = None
        self._alerts_ended = asyncio.Event()  # set while no window has an open alert
        self._alerts_ended.set()
        self._decoding = asyncio.Lock()  # one still decoded at a time per stream (a GOP of CPU each)

    def observe(self, event: Event) -> None:
        body = event.body
        if isinstance(body, DetectionsBody) and event.pts is not None:
            self.boxes.append((event.pts, body))
            return
        if isinstance(body, CaptionBody):
            self.captions.append((body.spoken.start, body.spoken.end, body.text))
            return
        if isinstance(body, DescriptionBody):
            end = body.window_end_pts if body.window_end_pts is not None else event.pts
            if end is not None:
                self.descriptions.append({"start_pts": body.window_start_pts, "end_pts": end,
                                          "text": body.text,
                                          "fields": None if body.structured is None else dict(body.structured),
                                          "model": body.model})
            return
        if not isinstance(body, AlertBody):
            return
        data = body.fields()
        self.alert_events.append({"pts": event.pts, **{k: data[k] for k in ALERT_FIELDS if k in data}})
        alert_id = body.alert_id
        settings = self.engine.settings
        if body.event == "start":
            start = body.started_pts - settings.pre_s
            window = self.windows[-1] if self.windows else None
            if window is None or (window.end is not None and start > window.end):
                window = Window(start, None)
                self.windows.append(window)
            window.end = None
            window.alert_ids.append(alert_id)
            window.open_alerts.add(alert_id)
            self._alerts_ended.clear()
            window.tracks.update(body.track_ids)
        elif body.event == "end":
            for window in self.windows:
                if alert_id in window.open_alerts:
                    window.open_alerts.discard(alert_id)
                    if not any(w.open_alerts for w in self.windows):
                        self._alerts_ended.set()
                    if not window.open_alerts:
                        ended = body.ended_pts if body.ended_pts is not None else event.pts or 0.0
                        window.end = ended + settings.post_s

    async def run(self) -> None:
        try:
            while True:
                frame = await self.frames.get()
                if self.encoder is not None:
                    await self._encode(frame)
                await self._cut_due(frame.pts, final=False)
        except MailboxClosed:
            pass
        finally:
            if self.encoder is not None:
                self.encoder.close()
        newest = self.ring.newest_t
        if newest is not None:
            await wait_set(self._alerts_ended, FINAL_ALERTS_WAIT_S)
            await self._cut_due(newest, final=True)

    async def _encode(self, frame: VideoFrame) -> None:
        last = self._last_encoded
        if (self.compute is not None and self.compute.short() and last is not None
                and 0.0 <= frame.pts - last < 1.0 / SHORT_FPS):  # (pts that went back: a reconnect)
            self.skipped += 1
            return
        try:
            packets = await asyncio.to_thread(self._encode_in_turn, frame)
        except ValueError as exc:  # a frame size H.264 cannot take: this stream gets no clips
            log.warning("frames not encoded for clips", extra={"stream_id": self.stream_id, "error": str(exc)})
            self.encoder = None
            return
        self._last_encoded = frame.pts
        self.encoded += 1
        for packet in packets:
            self.ring.put(frame.pts, packet)

    def _encode_in_turn(self, frame: VideoFrame) -> list[EncodedPacket]:
        assert self.encoder is not None
        turn = self.compute.turn(ENCODER) if self.compute is not None else contextlib.nullcontext()
        with turn:
            return self.encoder.encode(frame.image, frame.pts)

    async def _cut_due(self, now: float, *, final: bool) -> None:
        max_s = self.engine.settings.max_s
        for window in list(self.windows):
            if window.end is None and now - window.start >= max_s:
                # Still going: cut at max_s; the rest continues as a window of its own.
                await self._cut(window.start, window.start + max_s, window.alert_ids, window.tracks)
                window.start += max_s
            elif window.end is not None and (now >= window.end or final):
                self.windows.remove(window)
                await self._cut(window.start, min(window.end, now), window.alert_ids, window.tracks)
            elif final:
                self.windows.remove(window)
                await self._cut(window.start, now, window.alert_ids, window.tracks)

    async def export(self, start: float, end: float) -> ClipInfo:
        """A clip of any span still in the buffer, on request (media seconds, as events' pts).
        Raises ExportRefused saying why a span cannot be cut."""
        max_s = self.engine.settings.max_s
        if not end > start:
            raise ExportRefused("end must be after start")
        if end - start > max_s:
            raise ExportRefused(f"a clip is at most clips.max_s ({max_s:g} s)")
        oldest, newest = self.ring.oldest_t, self.ring.newest_t
        if oldest is None or newest is None or end < oldest or start > newest:
            held = "nothing yet" if oldest is None else f"{oldest:.3f} to {newest:.3f}"
            raise ExportRefused(f"that span is not in the stream's buffer (it holds {held})")
        info = await self._cut(start, end, [])
        if info is None:
            raise ExportRefused("the clip could not be written (see the service log)")
        return info

    def holds(self, t: float) -> bool:
        """Whether the buffer still holds the picture at media time `t`."""
        oldest, newest = self.ring.oldest_t, self.ring.newest_t
        return oldest is not None and newest is not None and oldest <= t <= newest

    async def still(self, t: float) -> tuple[bytes, float]:
        """The picture on screen at media time `t`, decoded from the buffer (from the keyframe
        before it) as JPEG, and that picture's own time. ExportRefused when the buffer no longer
        (or not yet) holds `t`."""
        if not self.holds(t):
            oldest, newest = self.ring.oldest_t, self.ring.newest_t
            held = "nothing yet" if oldest is None else f"{oldest:.3f} to {newest:.3f}"
            raise ExportRefused(f"{t:.3f} is not in the stream's buffer (it holds {held})")
        span = self.ring.cut(t, t)
        if not span:
            raise ExportRefused(f"{t:.3f} is not in the stream's buffer")
        async with self._decoding:
            try:
                jpeg, at = await asyncio.to_thread(_still_jpeg, [item.packet for item in span], t - span[0].t)
            except RemuxError as exc:
                raise ExportRefused(f"the picture at {t:.3f} could not be decoded: {exc}") from None
        self.stills += 1
        return jpeg, span[0].t + at

    async def _cut(self, start: float, end: float, alert_ids: list[str],
                   tracks: set[int] | None = None) -> ClipInfo | None:
        span = self.ring.cut(start, end)
        if not span:
            self.missed += 1
            return None
        clip_id = uuid.uuid4().hex
        origin = span[0].t  # the MP4's time 0
        extras = {".boxes.json": self._boxes(origin, span[-1].t)}
        captions = [(s - origin, e - origin, text) for s, e, text in self.captions if e > origin and s < span[-1].t]
        if captions:
            extras[".vtt"] = webvtt(captions)
        said = self._events(origin, span[-1].t, alert_ids)
        if said is not None:
            extras[".events.json"] = said
        info = await asyncio.to_thread(self.engine.store.write, clip_id, self.stream_id,
                                       [(item.t, item.packet) for item in span], list(alert_ids),
                                       extras=extras, alert_tracks=sorted(tracks or ()),
                                       redact=self.engine.settings.redact_for(self.stream_id))
        if info is None:
            self.failed += 1
            return None
        self.written += 1
        await self.sink.publish(clip_event(info, captured_at=time.time()))
        return info

    def _boxes(self, origin: float, end: float) -> bytes:
        frames = [{"t": round(pts - origin, 3), "pts": round(pts, 3), "frame_seq": body.frame_seq,
                   "objects": [obj.fields() for obj in body.objects]}
                  for pts, body in self.boxes if origin <= pts <= end + 1e-6]
        return json.dumps({"stream_id": self.stream_id, "frames": frames}, separators=(",", ":")).encode()

    def _events(self, origin: float, end: float, alert_ids: list[str]) -> bytes | None:
        """The clip's alerts (every start and end of the alerts it was cut for, and of any other in
        its span) and the descriptions of its span, on the clip's time (`t`); None when neither."""
        wanted = set(alert_ids)
        alerts = [{"t": round(a["pts"] - origin, 3) if a["pts"] is not None else None, **a}
                  for a in self.alert_events
                  if a.get("alert_id") in wanted or (a["pts"] is not None and origin <= a["pts"] <= end)]
        descriptions = [{"t": round(d["end_pts"] - origin, 3), **d} for d in self.descriptions
                        if d["end_pts"] >= origin and (d["start_pts"] if d["start_pts"] is not None
                                                       else d["end_pts"]) <= end]
        if not alerts and not descriptions:
            return None
        return json.dumps({"stream_id": self.stream_id, "alerts": alerts, "descriptions": descriptions},
                          separators=(",", ":"), ensure_ascii=False).encode()

    def stop(self) -> None:
        pass  # ends when the stream's frames end; pending clips are cut then

    def counters(self) -> Counters:
        ring = self.ring.stats
        return {
            "clips": self.written,
            "clips_failed": self.failed,
            "clips_missed": self.missed,
            "clip_packets": ring.packets,
            "clip_gops_dropped": ring.gops_dropped,
            "clip_buffer_bytes": self.ring.bytes,
            "clip_stills": self.stills,
            "clip_frames_encoded": self.encoded,
            "clip_frames_skipped": self.skipped,
        }


def webvtt(cues: list[tuple[float, float, str]]) -> bytes:
    """Captions as WebVTT on the clip's own time (0 at its first frame)."""
    lines = ["WEBVTT", ""]
    for start, end, text in cues:
        lines += [f"{_stamp(max(0.0, start))} --> {_stamp(max(0.0, end))}", text.replace("-->", "->"), ""]
    return "\n".join(lines).encode()


def _stamp(seconds: float) -> str:
    millis = round(seconds * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours:02d}:{minutes:02d}:{rest // 1000:02d}.{rest % 1000:03d}"


def clip_view(info: ClipInfo) -> dict[str, Any]:
    """A clip as the API and the `clips` event show it: its metadata, and where the HTTP API serves
    it and the extras written beside it."""
    links = {"self": f"/api/clips/{info.id}", "mp4": f"/api/clips/{info.id}.mp4"}
    if ".boxes.json" in info.extras:
        links["boxes"] = f"/api/clips/{info.id}.json"
    if ".events.json" in info.extras:
        links["events"] = f"/api/clips/{info.id}.events.json"
    if ".vtt" in info.extras:
        links["vtt"] = f"/api/clips/{info.id}.vtt"
    return {**info.to_json(), "links": links}


@dataclass(frozen=True, slots=True)
class ClipBody(EventBody):
    """A finished clip: where it is and what it covers (docs/events.md: id, span, bytes, codec, alert ids, links)."""

    spec: ClassVar[KindSpec] = KindSpec("clips", durable=True, delivery=Delivery.EVERY)
    info: ClipInfo

    def fields(self) -> dict[str, Any]:
        body = clip_view(self.info)
        del body["stream_id"]  # the envelope's
        return body

    @classmethod
    def search(cls, data: Mapping[str, Any], *, stream_id: str, pts: float | None) -> Findable:
        clip_id = str(data["clip_id"])
        alerts = [str(a) for a in data.get("alert_ids") or ()]
        text = f"clip of {data.get('duration_s')} s" + (f" for alert {' '.join(alerts)}" if alerts else "")
        return Findable(text, search_number(data.get("start_pts")), search_number(data.get("end_pts")),
                        {"clip_id": clip_id})


def clip_event(info: ClipInfo, *, captured_at: float) -> Event:
    return Event(stream_id=info.stream_id, pts=round(info.end_pts, 3), captured_at=captured_at, body=ClipBody(info))


def _still_jpeg(packets: list[EncodedPacket], offset_s: float) -> tuple[bytes, float]:
    image, at = still_at(packets, offset_s)
    ok, data = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, STILL_QUALITY])
    if not ok:
        raise RemuxError("JPEG encoding failed")
    return bytes(data), at


def build(ctx: StageContext) -> ClipStage | None:
    engine = ctx.engines.get(CLIPS)
    if engine is None or not ctx.spec.wants(STAGE_NAME):
        return None
    settings = engine.settings
    ring = PacketRing(max_s=settings.buffer_s, max_bytes=settings.buffer_max_bytes)
    encoder: FrameEncoder | None = None
    if ctx.demuxed:
        ctx.packets(ring)
    else:  # decoded frames only: encode them (in the compute budget's background turns)
        encoder = FrameEncoder()
    compute = ctx.engines.detector.compute if ctx.engines.detector is not None else None
    stage = ClipStage(ctx.stream_id, engine, ring, ctx.frames(STAGE_NAME), ctx.sink, encoder=encoder,
                      compute=compute)
    ctx.observe(stage.observe)
    return stage
