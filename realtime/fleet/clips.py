"""Clips in a fleet: any worker lists and serves any clip, and a dead worker's finished clips stay.

A clip is written on the disk of the worker that runs its stream (pipelines.clips.store); the
`clips` event it publishes passes this worker's event fanout, whose tap queues the clip for upload
to the fleet's bucket (realtime.fleet.clip_bucket). The queue is bounded; what it drops, and what a
worker killed between writing and uploading left on its disk, is uploaded by the reconcile pass
that runs at start and every `RECONCILE_S` (every local clip the bucket does not list). That pass
also applies each stream's own retention bounds to the bucket, its totals, and sweeps what
interrupted uploads left.

Reading: the API lists this worker's clips and the bucket's together (a bucket outage leaves the
local ones listed and says so); a clip only in the bucket is fetched and adopted into the local
store the first time it is asked for, so it is served with Range, redacted on export and bounded
exactly like a clip written here. Deleting removes both copies.

Cutting a clip on request needs the stream's buffer, which only the worker running it has: any
other worker forwards the request there over NATS (`_VIDSENTRY.clips.<fleet>.<node>`), and the
owner cuts it, uploads it and answers with its metadata, so the worker that was asked can serve
it at once (from the bucket).

Once a clip is in the bucket, the bucket is its source of truth: each worker keeps the ids of its
local clips the bucket has held (`UPLOADED_FILE` in `clips.dir`, kept across restarts), so a clip
deleted through another worker, or evicted by the bucket's retention, is neither listed here nor
uploaded again; the reconcile pass removes the local copy (`withdrawn`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from engines.media.files import replacing
from pipelines.capability import Sample
from pipelines.clips.engine import ClipEngine
from pipelines.clips.stage import ClipBody, ExportRefused
from pipelines.clips.store import CLIP_ID, ClipInfo, ClipStore, retention
from pipelines.events import Event
from pipelines.frames import validate_stream_id
from pipelines.tasks import check_cancelled
from realtime.bus.publisher import NatsEventPublisher, live_client
from realtime.errors import ServiceError
from realtime.fleet.clip_bucket import MP4, ClipBucket, ClipBucketError, clip_bucket_name
from realtime.leases.options import FleetOptions

log = logging.getLogger(__name__)

QUEUE_LIMIT = 256  # clips waiting for upload; past it the reconcile pass uploads them
EXPORT_SUBJECT = "_VIDSENTRY.clips"  # + .<fleet>.<node>: a worker's exports on request
FORWARD_TIMEOUT_S = 30.0  # a forwarded export: cutting, writing and uploading a clip of up to max_s
MAX_REQUEST_BYTES = 4096
CACHE_DIR = ".fleet-cache"  # under clips.dir: downloads from the bucket on their way into the store
CACHE_MAX_BYTES = 1024**3
UPLOADED_FILE = ".fleet-uploaded"  # under clips.dir: ids of local clips the bucket has held, one per line
RECONCILE_S = 60.0


class ClipsUnavailable(ServiceError):
    """The fleet's bucket cannot be read now; the message says what to do."""


class ExportForwardRefused(ServiceError):
    """The worker running the stream refused a forwarded export; `status` and the message are its."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


Exporter = Callable[[str, float, float], Awaitable[ClipInfo]]  # (stream id, start, end) on this worker


@dataclass(slots=True)
class FleetClipStats:
    queued: int = 0
    queue_dropped: int = 0  # not queued (full): uploaded by the next reconcile pass instead
    reconciled: int = 0  # local clips the bucket lacked, uploaded by a reconcile pass
    adopted: int = 0  # clips recorded elsewhere, fetched to be served here
    list_failed: int = 0  # listings that fell back to this worker's clips (bucket unreachable)
    evicted_stream: int = 0  # bucket clips removed for their stream's own bounds
    withdrawn: int = 0  # local copies removed because the fleet deleted the clip (or its bucket evicted it)
    exports_forwarded: int = 0  # exports asked of another worker
    exports_answered: int = 0  # exports another worker asked of this one


def open_fleet_clips(fleet: FleetOptions, engine: object, publisher: NatsEventPublisher) -> FleetClips | None:
    """The fleet's clips over the publisher's connection, for the clips `engine` (None: clips off)."""
    if not isinstance(engine, ClipEngine):
        return None
    settings = engine.settings
    bucket = ClipBucket(publisher, bucket=clip_bucket_name(fleet.name), replicas=fleet.replicas,
                        max_bytes=settings.max_total_bytes,
                        max_age_s=settings.max_age_s, cache_dir=settings.dir / CACHE_DIR,
                        cache_max_bytes=min(CACHE_MAX_BYTES, settings.max_total_bytes))
    return FleetClips(engine.store, bucket, fleet=fleet.name, node=fleet.node)


class FleetClips:
    def __init__(self, store: ClipStore, bucket: ClipBucket, *, fleet: str = "", node: str = "",
                 reconcile_s: float = RECONCILE_S) -> None:
        self.store = store
        self.bucket = bucket
        self.fleet = fleet
        self.node = node
        self.exporter: Exporter | None = None  # set by the service: how this worker cuts a clip
        self.answering = False  # subscribed to the exports other workers forward here
        self.reconcile_s = reconcile_s
        self.stats = FleetClipStats()
        self._queue: asyncio.Queue[str] = asyncio.Queue(maxsize=QUEUE_LIMIT)
        self._adopting: dict[str, asyncio.Lock] = {}
        self._ledger = store.directory / UPLOADED_FILE
        self._uploaded = self._read_ledger()  # local clips the bucket has held

    # -- writing ---------------------------------------------------------------------------------

    def tap(self, event: Event) -> None:
        """A fanout tap: queue each clip this worker finished for upload (never blocks)."""
        if not isinstance(event.body, ClipBody):
            return
        try:
            self._queue.put_nowait(event.body.info.id)
            self.stats.queued += 1
        except asyncio.QueueFull:
            self.stats.queue_dropped += 1

    async def run(self) -> None:
        """Upload queued clips; reconcile at start and every `reconcile_s`; answer the exports other
        workers forward here. Until cancelled."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        responder: Any = None
        try:
            while True:
                check_cancelled()  # nats-py's object-store calls can swallow our cancel
                if responder is None:
                    responder = await self._answer_exports()
                    self.answering = responder is not None
                if loop.time() >= due:
                    await self.reconcile()
                    due = loop.time() + self.reconcile_s
                await self._upload_next(max(0.0, due - loop.time()))
        finally:
            self.answering = False
            if responder is not None:
                with contextlib.suppress(Exception):
                    await responder.unsubscribe()

    async def _upload_next(self, wait_s: float) -> None:
        """Upload the next finished clip, waiting at most `wait_s` for one."""
        try:
            async with asyncio.timeout(wait_s):
                clip_id = await self._queue.get()
        except TimeoutError:
            return
        info = self.store.get(clip_id)
        if info is not None:
            await self._upload(info)

    # -- exports on request, forwarded to the worker running the stream ------------------------

    def export_subject(self, node: str) -> str:
        return f"{EXPORT_SUBJECT}.{self.fleet}.{node.encode().hex()}"  # any node name makes a valid token

    async def _answer_exports(self) -> Any:
        nc = live_client(self.bucket.source)
        if nc is None or not self.fleet or not self.node:
            return None
        try:
            return await nc.subscribe(self.export_subject(self.node), cb=self._on_export)
        except nats.errors.Error:
            return None  # the next round tries again

    async def _on_export(self, msg: Msg) -> None:
        try:
            if len(msg.data) > MAX_REQUEST_BYTES:
                raise ExportForwardRefused(400, f"an export request is at most {MAX_REQUEST_BYTES} bytes")
            if self.exporter is None:
                raise ExportForwardRefused(409, "this worker cuts no clips")
            request = json.loads(msg.data)
            stream_id = validate_stream_id(request.get("stream_id"))
            start, end = float(request["start"]), float(request["end"])
            if not (math.isfinite(start) and math.isfinite(end)):
                raise ExportForwardRefused(400, "start and end must be finite")
            self.stats.exports_answered += 1
            info = await self.exporter(stream_id, start, end)
            await self._upload(info)  # in the bucket before the asking worker serves it
            reply: dict[str, Any] = {"status": 201, "clip": info.sidecar()}
        except ExportForwardRefused as exc:
            reply = {"status": exc.status, "error": str(exc)}
        except ExportRefused as exc:
            reply = {"status": 409, "error": str(exc)}
        except (ValueError, KeyError, TypeError, AttributeError):
            reply = {"status": 400, "error": "not an export request"}
        with contextlib.suppress(nats.errors.Error):
            await msg.respond(json.dumps(reply).encode())

    async def forward_export(self, owner: str, stream_id: str, start: float, end: float) -> ClipInfo:
        """Have `owner`, the worker running the stream, cut a clip; the clip (in the bucket by then).
        ExportForwardRefused with its status and reason, ClipsUnavailable when it does not answer."""
        nc = live_client(self.bucket.source)
        if nc is None:
            raise ClipsUnavailable("not connected to NATS; retry shortly")
        body = json.dumps({"stream_id": stream_id, "start": start, "end": end}).encode()
        self.stats.exports_forwarded += 1
        try:
            msg = await nc.request(self.export_subject(owner), body, timeout=FORWARD_TIMEOUT_S)
        except nats.errors.NoRespondersError:
            raise ClipsUnavailable(f"worker {owner} does not answer for clips now; retry shortly") from None
        except (nats.errors.TimeoutError, TimeoutError):
            raise ClipsUnavailable(f"worker {owner} did not answer within {FORWARD_TIMEOUT_S:g} s") from None
        reply = json.loads(msg.data)
        if reply.get("status") != 201:
            raise ExportForwardRefused(int(reply.get("status", 502)), str(reply.get("error", "refused")))
        info = _info(reply["clip"])
        if info is None:
            raise ClipsUnavailable(f"worker {owner} answered with something that is not a clip")
        return info

    async def reconcile(self) -> None:
        """Upload the local clips the bucket does not list, apply each stream's bounds and the
        totals to the bucket, and sweep interrupted uploads. An outage ends the pass (logged)."""
        try:
            listed = await self.bucket.list()
        except ClipBucketError as exc:
            log.warning("clip bucket not reconciled", extra={"bucket": self.bucket.bucket, "error": str(exc)})
            return
        there = {body.get("clip_id") for body in listed}
        for info in self.store.list():
            if info.id in there:
                self._uploaded.add(info.id)
            elif info.id in self._uploaded:  # the fleet deleted it (or the bucket evicted it)
                if await asyncio.to_thread(self.store.delete, info.id):
                    self.stats.withdrawn += 1
            elif await self._upload(info):
                self.stats.reconciled += 1
        self._uploaded &= {c.id for c in self.store.list()}
        await asyncio.to_thread(self._write_ledger)
        if self.store.streams:
            clips = [c for c in (_info(body) for body in listed) if c is not None]
            for clip_id, _why in retention(clips, self.store.streams, 1 << 62, math.inf, time.time()):
                with contextlib.suppress(ClipBucketError):
                    if await self.bucket.delete(clip_id):
                        self.stats.evicted_stream += 1
        await self.bucket.enforce()
        await self.bucket.sweep()

    async def _upload(self, info: ClipInfo) -> bool:
        path = self.store.path(info.id)
        if path is None:
            return False  # deleted meanwhile (retention, a DELETE)
        files = {MP4: path}
        for suffix in info.extras:
            extra = self.store.extra(info.id, suffix)
            if extra is not None:
                files[suffix] = extra
        try:
            done = await self.bucket.put(info.sidecar(), files)
        except ValueError as exc:  # a malformed sidecar: a bug, but never the stream's end
            log.warning("clip not uploaded", extra={"clip_id": info.id, "error": str(exc)})
            return False
        if done:
            self._mark_uploaded(info.id)
        return done

    def _read_ledger(self) -> set[str]:
        try:
            return {line for line in self._ledger.read_text().split() if CLIP_ID.match(line)}
        except OSError:
            return set()  # none yet, or unreadable: the bucket's listing decides as before

    def _mark_uploaded(self, clip_id: str) -> None:
        self._uploaded.add(clip_id)
        try:
            with self._ledger.open("a") as ledger:  # at once: a restart must not upload it again
                ledger.write(clip_id + "\n")
        except OSError as exc:
            log.warning("clip upload not recorded", extra={"clip_id": clip_id, "error": str(exc)})

    def _write_ledger(self) -> None:
        try:
            with replacing(self._ledger) as tmp:
                tmp.write_text("".join(f"{clip_id}\n" for clip_id in sorted(self._uploaded)))
        except OSError as exc:
            log.warning("clip upload ledger not rewritten", extra={"error": str(exc)})

    # -- reading ---------------------------------------------------------------------------------

    async def list(self, stream_id: str | None = None) -> tuple[list[ClipInfo], bool]:
        """This worker's clips and the bucket's, oldest first, and whether the bucket answered."""
        local = {c.id: c for c in self.store.list(stream_id)}
        try:
            remote = await self.bucket.list(stream_id)
        except ClipBucketError:
            self.stats.list_failed += 1
            return list(local.values()), False
        held = {body.get("clip_id") for body in remote}
        # A local copy of a clip the bucket held and no longer does was deleted in the fleet.
        merged = {clip_id: c for clip_id, c in local.items() if clip_id in held or clip_id not in self._uploaded}
        for body in remote:
            info = _info(body)
            if info is not None and info.id not in merged:
                merged[info.id] = info
        return sorted(merged.values(), key=lambda c: c.created_at), True

    async def find(self, clip_id: str) -> ClipInfo | None:
        """The clip from this worker's store, fetching it from the bucket into the store first when
        another worker recorded it. None when no one has it; ClipsUnavailable during an outage."""
        info = self.store.get(clip_id)
        if info is not None:
            return info
        lock = self._adopting.setdefault(clip_id, asyncio.Lock())
        try:
            async with lock:  # one fetch per clip however many ask at once
                info = self.store.get(clip_id)
                return info if info is not None else await self._adopt(clip_id)
        finally:
            if not lock.locked():
                self._adopting.pop(clip_id, None)

    async def _adopt(self, clip_id: str) -> ClipInfo | None:
        try:
            body = await self.bucket.get(clip_id)
        except ClipBucketError as exc:
            raise ClipsUnavailable(f"the fleet's clip bucket cannot be read now ({exc}); retry shortly") from None
        info = _info(body) if body is not None else None
        if info is None:
            return None
        files: dict[str, Path] = {}
        for suffix in (MP4, *info.extras):
            path = await self.bucket.fetch(clip_id, suffix)
            if path is None:
                if suffix == MP4:
                    raise ClipsUnavailable("the clip could not be fetched from the fleet's bucket; retry shortly")
                continue
            files[suffix] = path
        try:
            adopted = await asyncio.to_thread(self.store.adopt, info, files)
            self._mark_uploaded(clip_id)  # the bucket's copy: deleting it in the fleet withdraws this one
        except OSError as exc:
            raise ClipsUnavailable(f"the clip could not be kept on this worker's disk "
                                   f"({exc.strerror or exc})") from None
        self.stats.adopted += 1
        return adopted

    async def delete(self, clip_id: str) -> bool:
        """Both copies; True when either existed. ClipsUnavailable when the bucket cannot say."""
        here = await asyncio.to_thread(self.store.delete, clip_id)
        self._uploaded.discard(clip_id)
        try:
            there = await self.bucket.delete(clip_id)
        except ClipBucketError as exc:
            raise ClipsUnavailable(f"the fleet's clip bucket cannot be changed now ({exc}); retry shortly") from None
        return here or there

    def samples(self) -> Iterable[Sample]:
        stats = self.stats
        yield Sample("vidsentry_fleet_clips_queue_dropped", "Clips not queued for upload (the queue was full)",
                     stats.queue_dropped)
        yield Sample("vidsentry_fleet_clips_reconciled", "Local clips uploaded by a reconcile pass", stats.reconciled)
        yield Sample("vidsentry_fleet_clips_adopted", "Clips recorded by another worker, fetched to be served here",
                     stats.adopted)
        yield Sample("vidsentry_fleet_clips_list_failed", "Clip listings without the bucket (unreachable)",
                     stats.list_failed)
        yield Sample("vidsentry_fleet_clips_evicted_stream", "Bucket clips removed for their stream's own bounds",
                     stats.evicted_stream)
        yield Sample("vidsentry_fleet_clips_withdrawn", "Local copies removed: the fleet deleted the clip",
                     stats.withdrawn)
        yield Sample("vidsentry_fleet_clips_exports_forwarded", "Exports on request sent to the worker running the "
                     "stream", stats.exports_forwarded)
        yield Sample("vidsentry_fleet_clips_exports_answered", "Exports on request other workers sent here",
                     stats.exports_answered)
        yield from self.bucket.samples()


def _info(body: dict[str, Any]) -> ClipInfo | None:
    try:
        return ClipInfo.from_json(body)
    except (KeyError, TypeError, ValueError):
        return None

