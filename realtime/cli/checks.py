"""Argument checks the commands share; each failure is a CommandError (exit 2, one line).

argparse turns `nan` and `inf` into floats without complaint, and a `--nats-url` is otherwise only
found wrong after the connect timeout.
"""

from __future__ import annotations

import math

from realtime.cli.errors import CommandError
from realtime.config import check_nats_url


def positive(flag: str, value: float | None, *, unit: str = "") -> None:
    """A finite number above 0 (argparse lets `nan` and `inf` through), or not given."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise CommandError(f"{flag} must be a positive number{' of ' + unit if unit else ''}")


def nats_url(value: str | None) -> str | None:
    """The --nats-url as given, or None; the same rule as `nats.url` in the config."""
    if value is None:
        return None
    try:
        return check_nats_url(value)
    except ValueError as exc:
        raise CommandError(f"--nats-url {exc}") from None
