"""The `vidsentry` command line. Exit codes: 0 ok, 1 runtime failure, 2 bad usage or input.

Dispatch only: each command's module (and the engines, NATS and aiohttp behind it) is
imported once that command was chosen, so `vidsentry --help` stays instant.
"""

from __future__ import annotations

import asyncio
import os
import sys

from realtime.cli.args import LOG_LEVEL_ENV, LOG_LEVELS, build_parser
from realtime.logs import setup_logging


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # started as a program (not called from Python): it may change its allocator
        from realtime.cli.allocator import reexec_on_jemalloc

        reexec_on_jemalloc(sys.argv[1:])
    args = build_parser().parse_args(argv)
    # Once a command was chosen: CommandError derives from the project's error root, in engines/.
    from realtime.cli.errors import EXIT_USAGE, CommandError

    # A service's progress is its log: info by default for serve, warnings only for the foreground tools.
    default_level = "INFO" if args.command == "serve" else None
    level, where = (args.log_level, "--log-level") if args.log_level else (os.environ.get(LOG_LEVEL_ENV), LOG_LEVEL_ENV)
    if level and level.lower() not in LOG_LEVELS:
        print(f"vidsentry: error: {where} {level!r} is not a log level; use one of {', '.join(LOG_LEVELS)}",
              file=sys.stderr)
        return EXIT_USAGE
    setup_logging(level or default_level)
    try:
        if args.command == "serve":
            from realtime.cli.serve import serve_command

            return asyncio.run(serve_command(args))
        if args.command == "run":
            from realtime.cli.run import run_command

            return asyncio.run(run_command(args))
        if args.command == "subscribe":
            from realtime.cli.subscribe import subscribe_command

            return asyncio.run(subscribe_command(args))
        if args.command in ("search", "ask"):
            from realtime.cli.search import ask_command, search_command

            return asyncio.run(search_command(args) if args.command == "search" else ask_command(args))
        from realtime.cli.doctor import doctor_command

        return doctor_command(args)
    except CommandError as exc:
        print(f"vidsentry: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
