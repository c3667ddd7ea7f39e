"""The catalogue of per-stream counters: what each key means and whether it only grows.

Sources and stages report plain `{key: number}` dicts; they describe their keys here once, at
import, so `/metrics`, the API and the run summary can show every counter without knowing the
stage that keeps it. `metric` / `label` fold several keys into one labelled Prometheus family
(`frames_in` and `frames_dropped` are `vidsentry_stream_frames_total{stage="in"|"dropped"}`);
without them a key `k` is exported as `vidsentry_stream_<k>_total` (counter) or
`vidsentry_stream_<k>` (gauge).

A key is normally reported by one stage. A key that several stages report, each for its own part
of the stream, is declared `summed`: the stream's value is their sum (`alerts` counts the frame
loop's rule alerts and the describer's `vlm` alerts alike: alerts started on this stream).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Counters = dict[str, float]


@dataclass(frozen=True, slots=True)
class CounterInfo:
    kind: Literal["counter", "gauge"]
    help: str
    metric: str | None = None  # Prometheus name without the vidsentry_stream_ prefix
    label: tuple[str, str] | None = None  # (label name, value) within that family


def counter(help: str, *, metric: str | None = None, label: tuple[str, str] | None = None) -> CounterInfo:
    return CounterInfo("counter", help, metric, label)


def gauge(help: str, *, metric: str | None = None, label: tuple[str, str] | None = None) -> CounterInfo:
    return CounterInfo("gauge", help, metric, label)


# Keys folded into one labelled family share its help text.
FRAMES_HELP = (
    "Video frames per stream: in (decoded), processed (by the model), predicted (the tracker's boxes on a "
    "frame the model skipped), dropped (latest-frame-wins), skipped (detect_fps), failed (detector error)"
)
QUEUE_DEPTH_HELP = "Items waiting per stream queue: mailbox (frames), status (events), channel (browser events)"


def frame_stage(stage: str) -> CounterInfo:
    return counter(FRAMES_HELP, metric="frames", label=("stage", stage))


def queue_depth(queue: str) -> CounterInfo:
    return gauge(QUEUE_DEPTH_HELP, metric="queue_depth", label=("queue", queue))


_CATALOGUE: dict[str, CounterInfo] = {}
_SUMMED: set[str] = set()


def register_counters(entries: Mapping[str, CounterInfo]) -> None:
    """Describe counter keys; a key described twice must mean the same thing."""
    for key, info in entries.items():
        known = _CATALOGUE.setdefault(key, info)
        if known != info:
            raise ValueError(f"counter {key!r} is already described differently")


def summed(*keys: str) -> None:
    """`keys` may be reported by several stages of one stream, each counting its own part: the
    stream's counters hold their sum."""
    _SUMMED.update(keys)


def merge_counters(into: Counters, part: Mapping[str, float]) -> None:
    """Merge one stage's (or the source's) counters into a stream's: a key declared `summed` adds
    up over the stages that report it; any other key takes the value reported."""
    for key, value in part.items():
        into[key] = into[key] + value if key in _SUMMED and key in into else value


def zero_counters() -> Counters:
    """Every described counter at 0: the shape of a stream's counters before (or without) a run,
    so clients see the same keys for every stream. Stages' counters merge into it (`merge_counters`)."""
    return dict.fromkeys(_CATALOGUE, 0)


def counter_info(key: str) -> CounterInfo:
    """How to show `key`; an undescribed key is shown as a gauge rather than lost."""
    return _CATALOGUE.get(key) or CounterInfo("gauge", key.replace("_", " "))


register_counters(
    {
        "status_events_dropped": counter("Status events dropped (queue full)"),
        "status_queue_depth": queue_depth("status"),
    }
)
