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

from pipelines.capabilities import CAPABILITIES, hearing
from pipelines.capability import Printer
from pipelines.compute import ComputeBudget
from pipelines.detect import DetectionBatcher
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
    with_capability_flags,
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


class EventPrinter:
    """The sink the stream publishes into: every event goes on to NATS, and what each capability
    prints of its events (pipelines.capability.Printer: what was said, the scene descriptions)
    also goes to stdout, unless `quiet` (--json: stdout is for the summary)."""

    def __init__(self, sink: EventSink, printers: Sequence[Printer], *, quiet: bool) -> None:
        self._sink = sink
        self._printers = printers
        self._quiet = quiet

    async def publish(self, event: Event) -> None:
        await self._sink.publish(event)
        for printer in self._printers:
            self._print(printer.see(event))

    def flush(self) -> None:
        """Print what the printers still hold (the stream stopped)."""
        for printer in self._printers:
            self._print(printer.flush())

    def counts(self) -> dict[str, int]:
        """What the printers counted, for the summary."""
        return {key: n for printer in self._printers for key, n in printer.counts().items()}

    def _print(self, lines: list[str]) -> None:
        if not self._quiet:
            for line in lines:
                print(line, flush=True)


def capability_printers(config: Config) -> list[Printer]:
    """Each capability's printer, made for its section."""
    return [c.printer(config.section(c.section)) for c in CAPABILITIES if c.printer is not None]


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
    config = with_capability_flags(config, args)
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
            printer = EventPrinter(publisher, capability_printers(config), quiet=args.json)
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
        **printer.counts(),
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
