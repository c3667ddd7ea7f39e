"""The `vidsentry` command line. Exit codes: 0 ok, 1 runtime failure, 2 bad usage or input."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from realtime.logs import setup_logging


def _parser() -> argparse.ArgumentParser:
    from realtime.run_command import add_run_arguments
    from realtime.serve_command import add_serve_arguments

    parser = argparse.ArgumentParser(prog="vidsentry", description="Real-time video analytics with events over NATS")
    parser.add_argument("--log-level", help="debug, info, warning (default), error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the service: HTTP API, the config's streams, events over NATS")
    add_serve_arguments(serve)

    run = commands.add_parser("run", help="process one source in the foreground")
    add_run_arguments(run)

    sub = commands.add_parser("subscribe", help="print events from NATS as JSON lines")
    sub.add_argument("subject", nargs="?", default="vidsentry.>")
    sub.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    sub.add_argument("--count", type=int, help="exit after this many events")
    sub.add_argument("--duration", type=float, help="exit after this many seconds")

    commands.add_parser("doctor", help="which engines can run on this machine, and why not")
    return parser


def _doctor() -> int:
    from engines.registry import doctor

    checks = doctor()
    width = max(len(c.name) for c in checks)
    for check in checks:
        mark = "yes" if check.available else "no "
        print(f"{check.name:<{width}}  {mark}  {check.detail}")
    return 0 if any(c.available and c.name.startswith("onnxruntime") for c in checks) else 1


async def _subscribe(args: argparse.Namespace) -> int:
    from realtime.bus.subscriber import subscribe

    await subscribe(args.nats_url, args.subject, limit=args.count, duration=args.duration)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # A service's progress is its log: info by default for serve, warnings only for the foreground tools.
    default_level = "INFO" if args.command == "serve" else None
    setup_logging(args.log_level or os.environ.get("VIDSENTRY_LOG_LEVEL") or default_level)
    from realtime.run_command import CommandError

    try:
        if args.command == "serve":
            from realtime.serve_command import serve_command

            return asyncio.run(serve_command(args))
        if args.command == "run":
            from realtime.run_command import run_command

            return asyncio.run(run_command(args))
        if args.command == "subscribe":
            return asyncio.run(_subscribe(args))
        return _doctor()
    except CommandError as exc:
        print(f"vidsentry: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
