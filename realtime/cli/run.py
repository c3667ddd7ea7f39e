"""`vidsentry run SOURCE`: process one source in the foreground and print a summary."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from pipelines.capabilities import hearing
from pipelines.captions.utterances import SENTENCE_STOPS, UTTERANCE_PAUSE_S
from pipelines.compute import ComputeBudget
from pipelines.detect import DetectionBatcher
from pipelines.event_bodies import CaptionBody, DescriptionBody, SpokenBody, SpokenWord, TranscriptBody
from pipelines.events import DURABLE_KINDS, Event, EventSink
from pipelines.frames import StatusChange, StreamState
from pipelines.graph import SharedEngines
from pipelines.graph.counters import summary_lines
from pipelines.tasks import TaskOwner
from realtime.cli import checks
from realtime.cli.bootstrap import (
    compute_budget,
    load_configured_detector,
    open_bus,
    open_engines,
    with_vlm_flag,
)
from realtime.cli.errors import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, CommandError
from realtime.cli.progress import report_progress
from realtime.config import (
    CameraStreamSettings,
    Config,
    ConfigError,
    load_config,
    validation_problems,
)
from realtime.streams.runner import StreamRunner, StreamSummary
from realtime.streams.spec import StreamSpec, stream_spec

log = logging.getLogger(__name__)

# After the source stops: how long JetStream gets to answer for the last events. What it has not
# answered by then is reported as unconfirmed (without an outbox) or left in the outbox.
FLUSH_DEADLINE_S = 5.0


def _check_args(args: argparse.Namespace) -> None:
    checks.positive("--duration", args.duration, unit="seconds")
    checks.positive("--detect-fps", args.detect_fps)
    if args.conf is not None and not 0.0 < args.conf < 1.0:  # false for NaN too
        raise CommandError("--conf must be between 0 and 1")
    if args.connect_attempts < 0:
        raise CommandError("--connect-attempts must be 0 or more")
    checks.nats_url(args.nats_url)


def build_spec(args: argparse.Namespace, config: Config) -> StreamSpec:
    """The stream the arguments describe, through the same settings model as the config and the API."""
    try:
        settings = CameraStreamSettings(
            id=args.stream_id,
            url=args.source,
            ingest=args.ingest,
            realtime=args.realtime,
            audio=not args.no_audio,
            detect_fps=args.detect_fps,
        )
    except ValidationError as exc:
        # One line: the first problem, said as the flag would say it (`url` is SOURCE, `id` is --id).
        problem = validation_problems(exc)[0]
        raise CommandError(problem["message"] if problem["field"] in ("url", "id") else
                           f"{problem['field']}: {problem['message']}") from None
    return stream_spec(
        settings,
        tracker=config.tracker,
        supervisor=config.supervisor,
        max_failed_connects=args.connect_attempts or None,
    )


async def load_detector(args: argparse.Namespace, config: Config) -> Any:
    return await load_configured_detector(
        config.detector,
        model=args.model,
        engine=args.engine,
        conf=args.conf,
        precision=args.precision,
        cores=config.compute.cores,
    )


LINE_MAX_WORDS = 30  # a sentence that runs on is printed in pieces of about this many words


class CaptionPrinter:
    """The sink the stream publishes into: every event goes on to NATS; what was said, a line per
    sentence (or per utterance, where it ends without one), and scene descriptions also go to stdout.

    Lines are made of the transcript when the stream has one (`captions.transcript`, on by
    default): its pieces trail the speaker by a few seconds, but they are the speech decoded with
    the context the finals lacked, punctuated, so a sentence reads as one line. Finals come a few
    words at a time and mostly unpunctuated while someone talks on; joined, they ran on for thirty
    words a line. Without a transcript the finals are printed the same way."""

    def __init__(self, sink: EventSink, *, quiet: bool, transcript: bool = True) -> None:
        self._sink = sink
        self._quiet = quiet  # --json: stdout is for the summary
        self._read: type[SpokenBody] = TranscriptBody if transcript else CaptionBody
        self.captions = 0
        self.descriptions = 0
        self._line: list[str] = []
        self._line_start = 0.0
        self._line_end = 0.0
        self._line_stream = ""

    async def publish(self, event: Event) -> None:
        await self._sink.publish(event)
        body = event.body
        if isinstance(body, CaptionBody):
            self.captions += 1
        if isinstance(body, self._read) and not self._quiet:
            self._words(event.stream_id, body.spoken.words)
        elif isinstance(body, DescriptionBody):
            self.descriptions += 1
            if not self._quiet:
                print(f"[{event.stream_id} {event.pts or 0.0:7.1f}s] (scene) {body.text}", flush=True)

    def _words(self, stream_id: str, words: Sequence[SpokenWord]) -> None:
        for word in words:
            if not word.word:
                continue
            if self._line and (stream_id != self._line_stream or word.start - self._line_end >= UTTERANCE_PAUSE_S):
                self.flush()
            if not self._line:
                self._line_start, self._line_stream = word.start, stream_id
            self._line.append(word.word)
            self._line_end = word.end
            if word.word.endswith(SENTENCE_STOPS) or len(self._line) >= LINE_MAX_WORDS:
                self.flush()

    def flush(self) -> None:
        """Print the sentence gathered so far (at its end, a pause, or when the stream stops)."""
        if self._line:
            print(f"[{self._line_stream} {self._line_start:7.1f}s] {' '.join(self._line)}", flush=True)
            self._line = []


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
        f"  speed       {s.fps_processed:.2f} fps processed over {s.elapsed_s:.1f} s",
        # Every counter the stream's source and stages reported, grouped by the capability that
        # keeps it (the counter catalogue): this command names none of them.
        *(_wrapped(section, values) for section, values in summary_lines(s.counters)),
        f"  latency     capture→publish p50 {ms(s.latency_p50_ms)}, p99 {ms(s.latency_p99_ms)}; "
        f"model p50 {ms(s.inference_p50_ms)}",
        f"  events      published {extra['events_published']}, stored {extra['events_acked']}, "
        f"failed {extra['events_failed']} ({extra['events_unconfirmed']} unconfirmed at the deadline), "
        f"dropped while disconnected {extra['events_dropped']}, duplicates {extra['events_duplicates']}",
        f"  outbox      spooled {extra['events_spooled']}, replayed {extra['events_replayed']}, "
        f"dropped when full {extra['events_dropped_overflow']}, waiting for the next start {extra['outbox_waiting']}",
    ]
    if extra.get("compute"):
        shares = ", ".join(
            f"{name} {m['busy_share']:.0%} busy ({m['waits']} waits, {m['wait_s']:.1f} s)"
            for name, m in extra["compute"]["models"].items()
        )
        lines.append(f"  compute     budget of {extra['compute']['cores']} cores: {shares}")
    return "\n".join(lines)


def _wrapped(section: str, values: str) -> str:
    return textwrap.fill(values, width=110, initial_indent=f"  {section:<11} ", subsequent_indent=" " * 14)


def compute_summary(budget: ComputeBudget | None, elapsed_s: float) -> dict[str, Any] | None:
    """What the compute budget decided over the run: each model's part of the cores and its waits."""
    if budget is None:
        return None
    state = budget.snapshot()
    for model in state["models"].values():  # over the whole run, not the recent seconds
        model["busy_share"] = round(model["thread_s"] / (budget.cores * max(elapsed_s, 1e-9)), 3)
    return state


async def run_command(args: argparse.Namespace) -> int:
    _check_args(args)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    spec = build_spec(args, config)
    config = with_vlm_flag(config, args.vlm_url)
    detector = await load_detector(args, config)
    was_live = False

    def on_status(change: StatusChange) -> None:
        nonlocal was_live
        was_live = was_live or change.state is StreamState.LIVE
        print_status(change)

    try:
        nats_url = args.nats_url or config.nats.url
        off = hearing() if args.no_audio else []  # no audio: nothing to caption
        compute = compute_budget(config, detector, off=off)
        async with (
            open_bus(nats_url, config.nats, config.node) as publisher,
            DetectionBatcher(detector, compute=compute) as batcher,
            open_engines(config, compute, off=off) as opened,
        ):
            printer = CaptionPrinter(publisher, quiet=args.json, transcript=config.section("captions").transcript)
            engines = SharedEngines(batcher, opened=opened)
            runner = StreamRunner(spec, engines, printer, on_status=on_status)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, runner.stop)
            progress = TaskOwner("vidsentry run")
            progress.spawn(report_progress(runner), "progress", critical=False)
            timer = loop.call_later(args.duration, runner.stop) if args.duration else None
            try:
                state = await runner.run()
            finally:
                if timer is not None:
                    timer.cancel()
                await progress.cancel_all()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            # Settle (or give up on) every event before the summary counts them: bounded, so a
            # broker that refuses or does not answer cannot hold the exit.
            await publisher.close(timeout=FLUSH_DEADLINE_S)
            printer.flush()
            summary = runner.summary()
            budget = compute_summary(compute, summary.elapsed_s)
            stats = publisher.stats
    finally:
        detector.close()

    totals = stats.totals()
    durable = [stats.kinds[kind.value] for kind in DURABLE_KINDS if kind.value in stats.kinds]
    lost = sum(k.failed for k in durable)
    extra = {
        "captions": printer.captions,
        "descriptions": printer.descriptions,
        "events_published": totals.published,
        "events_acked": totals.acked,
        "events_failed": totals.failed,
        "events_lost": lost,  # durable events JetStream did not store (or did not confirm)
        "events_unconfirmed": totals.unconfirmed,
        "events_dropped": totals.dropped,
        "events_duplicates": totals.duplicates,
        "events_spooled": totals.spooled,
        "events_replayed": totals.replayed,
        "events_dropped_overflow": totals.dropped_overflow,
        "outbox_waiting": stats.outbox_depth,
        "compute": budget,
    }
    text = summary_text(summary, extra)
    if args.json:
        print(text, file=sys.stderr)
        print(json.dumps({**summary.to_json(), **extra}))
    else:
        print(text)
    if state is StreamState.FAILED:
        reason = summary.reason or "source failed"
        # A file that fails is a bad file, and a camera never reached is a wrong URL: bad input. A camera
        # lost after it was live is a runtime failure.
        camera = spec.camera
        bad_input = (camera is not None and camera.source.is_file) or not was_live
        raise CommandError(f"{runner.source.display}: {reason}", EXIT_USAGE if bad_input else EXIT_RUNTIME)
    if lost:
        unanswered = f" ({totals.unconfirmed} unanswered within {FLUSH_DEADLINE_S:g} s)" if totals.unconfirmed else ""
        why = f"; last error: {stats.last_error}" if stats.last_error else ""
        raise CommandError(f"{lost} durable events were not stored by JetStream{unanswered}{why}", EXIT_RUNTIME)
    return EXIT_OK
