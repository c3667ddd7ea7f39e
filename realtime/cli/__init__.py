"""The `vidsentry` command line: `main` dispatches to one module per command."""

from realtime.cli.main import main

__all__ = ["main"]
