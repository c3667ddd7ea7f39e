"""Finished clips on the local disk: one MP4 per clip beside a JSON sidecar, bounded by bytes and age.

A clip is written under a temporary name and renamed when complete (engines.media.remux), then its
sidecar the same way; a clip is listed only once both are there. What a crash leaves half-written
(a `.part` file, an MP4 without its sidecar) is removed when the store opens, never served. The
oldest clips go first when the total passes `max_total_bytes`, and any older than `max_age_s`;
a stream may have bounds of its own (`clips.streams.<id>`), applied first. Every deletion is
counted by its reason, as are writes the disk refused.

A stream with `redact` classes has its clips written as the camera sent them and marked
(`redact_on_export`); the first download re-encodes the MP4 in place with those boxes pixelated
(`redact_for_export`), so the CPU is spent only on clips someone takes out, and the unredacted
picture never leaves the service.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.media.files import replacing
from engines.media.redact import Redacted, redact_mp4
from engines.media.remux import EncodedPacket, write_mp4

log = logging.getLogger(__name__)

CLIP_ID = re.compile(r"^[0-9a-f]{32}$")
EXTRAS = (".boxes.json", ".vtt", ".events.json")  # written beside a clip's MP4 and its sidecar


@dataclass(slots=True)
class StoreStats:
    written: int = 0
    failed: int = 0  # the disk refused a clip (full, read-only): the stream goes on
    evicted_bytes: int = 0  # removed for the total's bound
    evicted_age: int = 0  # removed for their age
    evicted_stream_bytes: int = 0  # removed for their stream's own bound (clips.streams.<id>.max_bytes)
    evicted_stream_age: int = 0  # removed for their stream's own age (clips.streams.<id>.max_age_s)
    redacted_on_export: int = 0  # MP4s re-encoded with boxes pixelated on their first download
    adopted: int = 0  # clips another worker recorded, copied here from the fleet's bucket to be served
    removed_partial: int = 0  # half-written files found when the store opened


@dataclass(frozen=True, slots=True)
class ClipInfo:
    id: str
    stream_id: str
    start_pts: float
    end_pts: float
    duration_s: float
    bytes: int
    codec: str
    width: int
    height: int
    alert_ids: tuple[str, ...]
    created_at: float
    alert_tracks: tuple[int, ...] = ()  # the tracks its alerts are about (never redacted)
    redacted: dict[str, Any] | None = None  # once redacted: the classes pixelated, the tracks kept, its source
    redact: tuple[str, ...] = ()  # classes still to pixelate before its MP4 leaves the service
    extras: tuple[str, ...] = ()  # the EXTRAS written beside it (kept in the sidecar, not in to_json)

    def to_json(self) -> dict[str, Any]:
        return {
            "clip_id": self.id,
            "stream_id": self.stream_id,
            "start_pts": round(self.start_pts, 3),
            "end_pts": round(self.end_pts, 3),
            "duration_s": round(self.duration_s, 3),
            "bytes": self.bytes,
            "codec": self.codec,
            "width": self.width,
            "height": self.height,
            "alert_ids": list(self.alert_ids),
            "alert_tracks": list(self.alert_tracks),
            "created_at": round(self.created_at, 3),
            "redacted": self.redacted,
            "redact_on_export": list(self.redact),
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ClipInfo:
        return cls(str(body["clip_id"]), str(body["stream_id"]), float(body["start_pts"]), float(body["end_pts"]),
                   float(body["duration_s"]), int(body["bytes"]), str(body["codec"]), int(body["width"]),
                   int(body["height"]), tuple(str(a) for a in body["alert_ids"]), float(body["created_at"]),
                   tuple(int(t) for t in body.get("alert_tracks", ())), body.get("redacted"),
                   tuple(str(c) for c in body.get("redact_on_export", ())),
                   tuple(str(e) for e in body.get("extras", ()) if e in EXTRAS))

    def sidecar(self) -> dict[str, Any]:
        """The JSON kept beside the MP4: what `to_json` says, and which extras were written."""
        return {**self.to_json(), "extras": list(self.extras)}


@dataclass(frozen=True, slots=True)
class StreamBounds:
    """A stream's own retention (None: only the store's total bounds apply)."""

    max_bytes: int | None = None
    max_age_s: float | None = None


@dataclass
class ClipStore:
    directory: Path
    max_total_bytes: int
    max_age_s: float
    streams: Mapping[str, StreamBounds] = field(default_factory=dict)  # by stream id
    stats: StoreStats = field(default_factory=StoreStats)
    _clips: dict[str, ClipInfo] = field(default_factory=dict, repr=False)  # oldest first
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def open(self) -> None:
        """Create the directory, drop what a crash left half-written, and index the clips there."""
        self.directory.mkdir(parents=True, exist_ok=True)
        found: list[ClipInfo] = []
        extras: list[Path] = []  # judged once the clips are known
        for path in self.directory.iterdir():
            partial = path.name.startswith(".") and path.name.endswith(".part")
            if partial or (path.suffix == ".mp4" and not path.with_suffix(".json").exists()):
                path.unlink(missing_ok=True)
                self.stats.removed_partial += 1
            elif path.name.endswith(EXTRAS):
                extras.append(path)
            elif path.suffix == ".json" and CLIP_ID.match(path.stem):
                try:
                    info = ClipInfo.from_json(json.loads(path.read_text()))
                except (OSError, ValueError, KeyError, TypeError):
                    info = None
                if info is None or not path.with_suffix(".mp4").exists():
                    path.unlink(missing_ok=True)
                    self.stats.removed_partial += 1
                    continue
                found.append(info)
        with self._lock:
            self._clips = {c.id: c for c in sorted(found, key=lambda c: c.created_at)}
        for path in extras:  # of a clip that was never finished
            if path.name[:32] not in self._clips:
                path.unlink(missing_ok=True)
                self.stats.removed_partial += 1
        self.enforce()

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(c.bytes for c in self._clips.values())

    def __len__(self) -> int:
        return len(self._clips)

    def list(self, stream_id: str | None = None) -> list[ClipInfo]:
        with self._lock:
            return [c for c in self._clips.values() if stream_id is None or c.stream_id == stream_id]

    def get(self, clip_id: str) -> ClipInfo | None:
        with self._lock:
            return self._clips.get(clip_id)

    def path(self, clip_id: str) -> Path | None:
        """The clip's MP4, only for an id this store lists (never a path built from arbitrary input)."""
        if self.get(clip_id) is None:
            return None
        return self.directory / f"{clip_id}.mp4"

    def write(self, clip_id: str, stream_id: str, packets: Sequence[tuple[float, EncodedPacket]],
              alert_ids: Sequence[str], *, extras: Mapping[str, bytes] | None = None,
              alert_tracks: Sequence[int] = (), redact: Sequence[str] = ()) -> ClipInfo | None:
        """Write one clip of `(pts, packet)` pairs, and `extras` beside it (suffix -> bytes, such
        as ".boxes.json"); `redact`: classes to pixelate when it is first downloaded. None
        (counted, logged) when the disk refused it."""
        if not CLIP_ID.match(clip_id):
            raise ValueError(f"not a clip id: {clip_id!r}")
        extras = dict(extras or {})
        try:
            written = write_mp4(self.directory / f"{clip_id}.mp4", [packet for _, packet in packets])
            first = packets[0][1]
            info = ClipInfo(clip_id, stream_id, packets[0][0], packets[0][0] + written.duration_s, written.duration_s,
                            written.bytes, first.header.codec, first.header.width, first.header.height,
                            tuple(alert_ids), time.time(), tuple(alert_tracks), redact=tuple(sorted(redact)),
                            extras=tuple(extras))
            self._add(info, extras)
        except OSError as exc:
            self._remove_files(clip_id)
            self.stats.failed += 1
            log.warning("clip not written", extra={"stream_id": stream_id, "clip_id": clip_id,
                                                   "error": str(exc) or type(exc).__name__})
            return None
        return info

    def redact(self, source: ClipInfo, new_id: str, classes: Sequence[str]) -> ClipInfo:
        """A copy of `source` with the boxes of `classes` pixelated, except its alerts' tracks (a
        re-encode, seconds per clip-minute: run it off the event loop). OSError for the disk."""
        if not CLIP_ID.match(new_id):
            raise ValueError(f"not a clip id: {new_id!r}")
        wanted = set(classes) | set(source.redact)  # a copy never shows what the original may not
        try:
            result = self._pixelate(source, self.directory / f"{new_id}.mp4", wanted)
            info = dataclasses.replace(
                source, id=new_id, bytes=result.bytes, codec="h264", created_at=time.time(), redact=(),
                redacted={"classes": sorted(wanted), "kept_tracks": sorted(source.alert_tracks),
                          "source": source.id, "regions": result.boxes},
            )
            copied = {suffix: (self.directory / f"{source.id}{suffix}").read_bytes() for suffix in source.extras}
            self._add(info, copied)  # the same boxes and words, on the same time
        except OSError:
            self._remove_files(new_id)
            self.stats.failed += 1
            raise
        return info

    def redact_for_export(self, clip_id: str) -> ClipInfo | None:
        """Pixelate a clip's `redact` classes in its own MP4, once, before it is served (a
        re-encode: run it off the event loop); the clip as it now is (None when it is gone).
        OSError for the disk: the clip stays unredacted and unserved."""
        info = self.get(clip_id)
        if info is None or not info.redact:
            return info
        path = self.directory / f"{clip_id}.mp4"
        result = self._pixelate(info, path, set(info.redact))  # replaces the file when complete
        done = dataclasses.replace(info, bytes=result.bytes, codec="h264", redact=(), redacted={
            "classes": list(info.redact), "kept_tracks": sorted(info.alert_tracks), "source": None,
            "regions": result.boxes})
        _write_atomically(self.directory / f"{clip_id}.json", json.dumps(done.sidecar()).encode())
        with self._lock:
            if clip_id in self._clips:
                self._clips[clip_id] = done
        self.stats.redacted_on_export += 1
        return done

    def _pixelate(self, source: ClipInfo, dst: Path, classes: set[str]) -> Redacted:
        """Re-encode `source`'s MP4 into `dst` with the boxes of `classes` pixelated on every frame,
        except the tracks its alerts are about."""
        kept = set(source.alert_tracks)
        boxes_path = self.directory / f"{source.id}.boxes.json"
        frames = json.loads(boxes_path.read_text())["frames"] if boxes_path.exists() else []
        regions = [
            (float(f["t"]), [tuple(o["box"]) for o in f["objects"]
                             if o.get("class") in classes and o.get("track_id") not in kept])
            for f in frames
        ]
        return redact_mp4(self.directory / f"{source.id}.mp4", dst, regions)

    def adopt(self, info: ClipInfo, files: Mapping[str, Path]) -> ClipInfo:
        """Keep a copy of a clip another worker recorded (`files`: suffix -> path, fetched from the
        fleet's bucket) as one of this store's, so it is served, redacted and bounded like the clips
        written here. OSError for the disk (nothing is left behind)."""
        if not CLIP_ID.match(info.id):
            raise ValueError(f"not a clip id: {info.id!r}")
        try:
            with replacing(self.directory / f"{info.id}.mp4") as tmp:
                shutil.copyfile(files[".mp4"], tmp)
            extras = {suffix: files[suffix].read_bytes() for suffix in info.extras if suffix in files}
            info = dataclasses.replace(info, extras=tuple(extras))
            self._add(info, extras, written=False)
        except OSError:
            self._remove_files(info.id)
            raise
        self.stats.adopted += 1
        return info

    def _add(self, info: ClipInfo, extras: Mapping[str, bytes], *, written: bool = True) -> None:
        """Write a clip's extras, then its sidecar (which lists it: its MP4 is already written), and
        index it. OSError when the disk refuses (the caller removes what was written)."""
        for suffix, data in extras.items():
            _write_atomically(self.directory / f"{info.id}{suffix}", data)
        _write_atomically(self.directory / f"{info.id}.json", json.dumps(info.sidecar()).encode())
        with self._lock:
            self._clips[info.id] = info
            self._clips = dict(sorted(self._clips.items(), key=lambda item: item[1].created_at))  # oldest first
        if written:
            self.stats.written += 1
        self.enforce()

    def delete(self, clip_id: str) -> bool:
        with self._lock:
            info = self._clips.pop(clip_id, None)
        if info is None:
            return False
        self._remove_files(clip_id)
        return True

    def enforce(self, now: float | None = None) -> None:
        """Delete what `retention` says is past the bounds (each stream's, then the totals)."""
        with self._lock:
            gone = retention(list(self._clips.values()), self.streams, self.max_total_bytes, self.max_age_s,
                             time.time() if now is None else now)
            for clip_id, _ in gone:
                del self._clips[clip_id]
        for clip_id, why in gone:
            setattr(self.stats, f"evicted_{why}", getattr(self.stats, f"evicted_{why}") + 1)
            self._remove_files(clip_id)

    def extra(self, clip_id: str, suffix: str) -> Path | None:
        """A listed clip's extra file (".boxes.json", ".vtt"), if it was written."""
        info = self.get(clip_id)
        if info is None or suffix not in info.extras:
            return None
        return self.directory / f"{clip_id}{suffix}"

    def _remove_files(self, clip_id: str) -> None:
        # The sidecar first: a clip without it is never listed again, whatever else is left.
        for suffix in (".json", ".mp4", *EXTRAS):
            try:
                (self.directory / f"{clip_id}{suffix}").unlink(missing_ok=True)
            except OSError as exc:
                log.warning("clip file not removed", extra={"clip_id": clip_id, "error": str(exc)})


def retention(clips: Sequence[ClipInfo], streams: Mapping[str, StreamBounds], max_total_bytes: int,
              max_age_s: float, now: float) -> list[tuple[str, str]]:
    """The clips to delete, with why ("stream_age", "stream_bytes", "age", "bytes"): first each
    stream's own bounds (its clips past its age, then its oldest while past its bytes), then clips
    past `max_age_s`, then the oldest of all while the total is past `max_total_bytes`. The newest
    clip is never deleted for bytes. The same rule for a worker's disk and a fleet's bucket."""
    kept = sorted(clips, key=lambda c: c.created_at)
    gone: list[tuple[str, str]] = []

    def drop(clip: ClipInfo, why: str) -> None:
        kept.remove(clip)
        gone.append((clip.id, why))

    for stream_id, bounds in streams.items():
        if bounds.max_age_s is not None:
            for clip in [c for c in kept if c.stream_id == stream_id and now - c.created_at > bounds.max_age_s]:
                drop(clip, "stream_age")
        if bounds.max_bytes is not None:
            own = [c for c in kept if c.stream_id == stream_id]
            used = sum(c.bytes for c in own)
            while used > bounds.max_bytes and len(own) > 1:
                clip = own.pop(0)
                used -= clip.bytes
                drop(clip, "stream_bytes")
    for clip in [c for c in kept if now - c.created_at > max_age_s]:
        drop(clip, "age")
    total = sum(c.bytes for c in kept)
    while total > max_total_bytes and len(kept) > 1:
        total -= kept[0].bytes
        drop(kept[0], "bytes")
    return gone


def _write_atomically(path: Path, data: bytes) -> None:
    with replacing(path) as tmp:
        tmp.write_bytes(data)
