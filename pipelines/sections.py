"""What every config section shares, wherever it is declared: a capability's package owns its
section (`pipelines/captions/config.py`, ...) and `realtime.config` composes them into one file.

Strict: an unknown key is an error naming it, a value is frozen once loaded, and Infinity or NaN
is no setting (JSON clients could not read it back).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict

MAX_TIMEOUT_S = 3600.0  # timeouts, backoffs and watchdogs: an hour is already no timeout
MAX_THREADS = 1024


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def default_of(cls: type, name: str) -> Any:
    """A dataclass field's default: settings take their defaults from the dataclass they build,
    so each default is written once."""
    for item in dataclasses.fields(cls):
        if item.name == name:
            return item.default
    raise AttributeError(f"{cls.__name__} has no field {name}")
