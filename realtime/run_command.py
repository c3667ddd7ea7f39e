"""`vidsentry run SOURCE`: process one source in the foreground and print a summary."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from engines.errors import EngineUnavailable
from engines.models import ModelNotFound, default_detector_model
from engines.registry import create_detector
from pipelines.detect import DetectionBatcher
from pipelines.frames import StatusChange, StreamState
from realtime.bus.embedded import EmbeddedNatsServer
from realtime.bus.outbox import Outbox
from realtime.bus.publisher import BusUnavailable, NatsEventPublisher
from realtime.config import Config, ConfigError, DetectorSettings, NatsSettings, load_config
from realtime.progress import report_progress
from realtime.stream_runner import StreamRunner, StreamSpec, StreamSummary

log = logging.getLogger(__name__)

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A failure to report as one line on stderr, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="file path, rtsp://… or http(s)://… URL")
    parser.add_argument("--id", dest="stream_id", default="cam", help="stream id (A-Z a-z 0-9 _ -, ≤ 64)")
    parser.add_argument("--model", help="Ultralytics YOLO detect export (.onnx); default: bundled people model")
    parser.add_argument("--config", help="YAML config: detector, tracker, supervisor and NATS settings (flags win)")
    parser.add_argument("--engine", choices=["auto", "tensorrt", "onnx-cuda", "onnx-cpu"], help="default: auto")
    parser.add_argument("--ingest", default="pyav", choices=["pyav", "gstreamer"], help="decoder backend")
    parser.add_argument("--nats-url", help="NATS server; default: start an embedded one on loopback")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--realtime", action="store_true", help="pace a file like a live camera")
    parser.add_argument("--no-audio", action="store_true", help="do not decode audio")
    parser.add_argument("--detect-fps", type=float, help="cap detection rate (default: every frame possible)")
    parser.add_argument("--conf", type=float, help="detection score threshold (default 0.25)")
    parser.add_argument("--vlm-url", help="OpenAI-compatible VLM endpoint for scene descriptions")
    parser.add_argument("--connect-attempts", type=int, default=3,
                        help="give up when a network source cannot be reached this many times in a row "
                        "before it was ever live (0: retry forever)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on the last stdout line")


def _check_args(args: argparse.Namespace) -> None:
    if args.duration is not None and args.duration <= 0:
        raise CommandError("--duration must be a positive number of seconds")
    if args.detect_fps is not None and args.detect_fps <= 0:
        raise CommandError("--detect-fps must be positive")
    if args.conf is not None and not 0.0 < args.conf < 1.0:
        raise CommandError("--conf must be between 0 and 1")
    if args.connect_attempts < 0:
        raise CommandError("--connect-attempts must be 0 or more")


def build_spec(args: argparse.Namespace, config: Config) -> StreamSpec:
    spec = StreamSpec(
        stream_id=args.stream_id,
        url=args.source,
        ingest=args.ingest,
        realtime=args.realtime,
        audio=not args.no_audio,
        detect_fps=args.detect_fps,
        policy=config.supervisor.to_policy(max_failed_connects=args.connect_attempts or None),
        tracker=config.tracker.to_config(),
    )
    try:
        spec.validated()
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    return spec


async def load_detector(args: argparse.Namespace, settings: DetectorSettings) -> Any:
    return await load_configured_detector(settings, model=args.model, engine=args.engine, conf=args.conf)


async def load_configured_detector(
    settings: DetectorSettings, *, model: str | None = None, engine: str | None = None, conf: float | None = None
) -> Any:
    """The detector the settings describe (arguments win); a bad model or engine is a CommandError."""
    try:
        path = Path(model) if model else settings.model or default_detector_model()
        return await asyncio.to_thread(
            create_detector,
            path,
            engine or settings.engine,
            conf=conf or settings.conf,
            iou=settings.iou,
            threads=settings.threads,
        )
    except (ValueError, ModelNotFound, EngineUnavailable) as exc:  # ModelLoadError is a ValueError
        raise CommandError(str(exc)) from exc


def open_outbox(settings: NatsSettings) -> Outbox | None:
    """The disk outbox the settings ask for (None without `outbox_dir`); the publisher owns it."""
    if settings.outbox_dir is None:
        return None
    try:
        return Outbox(settings.outbox_dir, max_events=settings.outbox_max_events, max_bytes=settings.outbox_max_bytes)
    except OSError as exc:  # OutboxError is one too (e.g. another process has the directory locked)
        raise CommandError(f"nats.outbox_dir {settings.outbox_dir}: {exc}", EXIT_RUNTIME) from exc


@contextlib.asynccontextmanager
async def open_bus(nats_url: str | None, settings: NatsSettings, node: str) -> AsyncIterator[NatsEventPublisher]:
    """Connect to the given NATS, or start an embedded server for the duration; with the
    configured disk outbox in front of it."""
    embedded: EmbeddedNatsServer | None = None
    store: tempfile.TemporaryDirectory[str] | None = None
    if nats_url is None:
        store = tempfile.TemporaryDirectory(prefix="vidsentry-nats-")
        embedded = EmbeddedNatsServer(store_dir=Path(store.name))
        await asyncio.to_thread(embedded.start)
        nats_url = embedded.url
        print(f"vidsentry: embedded NATS at {nats_url} (vidsentry subscribe --nats-url {nats_url})",
              file=sys.stderr)
    try:
        outbox = open_outbox(settings)
        try:
            publisher = NatsEventPublisher(
                nats_url,
                node=node,
                connect_timeout=settings.connect_timeout_s,
                stream_max_age_s=settings.stream_max_age_s,
                outbox=outbox,
            )
        except BaseException:
            if outbox is not None:
                outbox.close()
            raise
        try:
            try:
                await publisher.connect()
            except BusUnavailable as exc:
                raise CommandError(str(exc), EXIT_RUNTIME) from exc
            yield publisher
        finally:
            with contextlib.suppress(Exception):
                await publisher.close()  # closes the outbox too
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        if store is not None:
            store.cleanup()


def print_status(change: StatusChange) -> None:
    reason = f" ({change.reason})" if change.reason and change.reason != change.state.value else ""
    retry = f", retry in {change.retry_in:.1f}s" if change.retry_in else ""
    print(f"[{change.stream_id}] {change.state.value}{reason}{retry}", file=sys.stderr)


def summary_text(s: StreamSummary, extra: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.0f} ms"

    why = f" ({s.reason})" if s.reason not in (None, s.state) else ""
    lines = [
        f"vidsentry run: stream {s.stream_id} {s.state}{why}",
        f"  frames      in {s.frames_in}, processed {s.frames_processed}, dropped {s.frames_dropped}, "
        f"skipped {s.frames_skipped}, failed {s.frames_failed}",
        f"  speed       {s.fps_processed:.2f} fps processed over {s.elapsed_s:.1f} s",
        f"  detections  {s.detections} in {s.tracks} tracks ({s.track_events} track events)",
        f"  audio       {s.audio_seconds:.1f} s decoded, captions {extra['captions']}",
        f"  alerts      {s.alerts}",
        f"  source      reconnects {s.reconnects}, stalls {s.stalls}, corrupt packets {s.corrupt_packets}",
        f"  latency     capture→publish p50 {ms(s.latency_p50_ms)}, p99 {ms(s.latency_p99_ms)}; "
        f"model p50 {ms(s.inference_p50_ms)}",
        f"  events      published {extra['events_published']}, failed {extra['events_failed']}, "
        f"dropped while disconnected {extra['events_dropped']}",
    ]
    return "\n".join(lines)


async def run_command(args: argparse.Namespace) -> int:
    _check_args(args)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    spec = build_spec(args, config)
    if args.vlm_url:
        print("vidsentry: --vlm-url noted, but scene descriptions are not part of this build yet",
              file=sys.stderr)
    detector = await load_detector(args, config.detector)
    was_live = False

    def on_status(change: StatusChange) -> None:
        nonlocal was_live
        was_live = was_live or change.state is StreamState.LIVE
        print_status(change)

    try:
        nats_url = args.nats_url or config.nats.url
        async with open_bus(nats_url, config.nats, config.node) as publisher, DetectionBatcher(detector) as batcher:
            runner = StreamRunner(spec, batcher, publisher, on_status=on_status)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, runner.stop)
            progress = asyncio.create_task(report_progress(runner), name="progress")
            timer = loop.call_later(args.duration, runner.stop) if args.duration else None
            try:
                state = await runner.run()
            finally:
                if timer is not None:
                    timer.cancel()
                progress.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await progress
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            await publisher.flush(timeout=5.0)
            summary = runner.summary()
            totals = publisher.stats.totals()
    finally:
        detector.close()

    extra = {
        "captions": 0,
        "events_published": totals.published,
        "events_failed": totals.failed,
        "events_dropped": totals.dropped,
    }
    text = summary_text(summary, extra)
    if args.json:
        print(text, file=sys.stderr)
        print(json.dumps({**dataclasses.asdict(summary), **extra}))
    else:
        print(text)
    if state is StreamState.FAILED:
        reason = summary.reason or "source failed"
        # A file that fails is a bad file, and a camera never reached is a wrong URL: bad input. A camera
        # lost after it was live is a runtime failure.
        bad_input = runner.source.is_file or not was_live
        raise CommandError(f"{runner.source.display}: {reason}", EXIT_USAGE if bad_input else EXIT_RUNTIME)
    return EXIT_OK
