"""`vidsentry subscribe [SUBJECT]`: print events from NATS as JSON lines."""

from __future__ import annotations

import argparse

from realtime.bus.connection import BusUnavailable
from realtime.bus.subscriber import check_subject, subscribe
from realtime.cli import checks
from realtime.cli.errors import EXIT_OK, EXIT_RUNTIME, CommandError


async def subscribe_command(args: argparse.Namespace) -> int:
    checks.nats_url(args.nats_url)
    checks.positive("--duration", args.duration, unit="seconds")
    checks.positive("--connect-timeout", args.connect_timeout, unit="seconds")
    try:
        check_subject(args.subject)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    try:
        await subscribe(args.nats_url, args.subject, limit=args.count, duration=args.duration,
                        connect_timeout=args.connect_timeout)
    except BusUnavailable as exc:
        raise CommandError(str(exc), EXIT_RUNTIME) from None
    return EXIT_OK
