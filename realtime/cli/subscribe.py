"""`vidsentry subscribe [SUBJECT]`: print events from NATS as JSON lines."""

from __future__ import annotations

import argparse

from realtime.bus.subscriber import subscribe


async def subscribe_command(args: argparse.Namespace) -> int:
    await subscribe(args.nats_url, args.subject, limit=args.count, duration=args.duration)
    return 0
