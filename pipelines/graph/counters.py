"""The catalogue of per-stream counters: what each key means and whether it only grows.

Sources and stages report plain `{key: number}` dicts; they describe their keys here once, at
import, so `/metrics`, the API and the run summary can show every counter without knowing the
stage that keeps it. `metric` / `label` fold several keys into one labelled Prometheus family
(`frames_in` and `frames_dropped` are `vidsentry_stream_frames_total{stage="in"|"dropped"}`);
without them a key `k` is exported as `vidsentry_stream_<k>_total` (counter) or
`vidsentry_stream_<k>` (gauge).

Each registration names its `section` (the capability that keeps the keys: "captions", "vlm",
...), so the run summary prints every counter a stream reported, grouped and labelled, without a
line of its own per capability.

A key is normally reported by one stage. A key that several stages report, each for its own part
of the stream, is declared `summed`: the stream's value is their sum (`alerts` counts the frame
loop's rule alerts and the describer's `vlm` alerts alike: alerts started on this stream).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

Counters = dict[str, float]


@dataclass(frozen=True, slots=True)
class CounterInfo:
    kind: Literal["counter", "gauge"]
    help: str
    metric: str | None = None  # Prometheus name without the vidsentry_stream_ prefix
    label: tuple[str, str] | None = None  # (label name, value) within that family
    section: str | None = None  # the capability that keeps it, for the run summary (set at registration)


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


FRAMES = "frames"
STATUS = "status"


def frame_stage(stage: str) -> CounterInfo:
    return replace(counter(FRAMES_HELP, metric=FRAMES, label=("stage", stage)), section=FRAMES)


def queue_depth(queue: str) -> CounterInfo:
    return gauge(QUEUE_DEPTH_HELP, metric="queue_depth", label=("queue", queue))


_CATALOGUE: dict[str, CounterInfo] = {}
_SUMMED: set[str] = set()


def register_counters(entries: Mapping[str, CounterInfo], *, section: str) -> None:
    """Describe counter keys of one capability (`section`); a key described twice must mean the
    same thing."""
    for key, described in entries.items():
        info = described if described.section is not None else replace(described, section=section)
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
        "tasks_running": gauge("Tasks the stream's stages run beside their loops (requests in flight)"),
        "task_crashes": counter("Tasks of the stream's stages that ended with an error (logged with a traceback)"),
    },
    section=STATUS,
)


FRAME_STAGES = ("in", "processed", "predicted", "dropped", "skipped", "failed")  # a frame's way, in order


def summary_lines(counters: Mapping[str, float]) -> list[tuple[str, str]]:
    """(section, "label value, ...") for every counter a stream reported: the frames first, then
    each capability in the order the stream reported it (its source, then its stages in graph
    order), the graph's own status queue last. A section with nothing counted is left out, as are
    gauges (a queue's depth now says nothing about a finished run) and undescribed keys."""
    sections: dict[str, list[tuple[int, str, float]]] = {}
    for key, value in counters.items():
        info = _CATALOGUE.get(key)
        if info is None or info.kind != "counter" or info.section is None:
            continue
        label = key.removeprefix(f"{info.section}_").replace("_", " ")
        rank = FRAME_STAGES.index(info.label[1]) if info.section == FRAMES and info.label else 0
        sections.setdefault(info.section, []).append((rank, label, value))
    order = [FRAMES, *(name for name in sections if name not in (FRAMES, STATUS)), STATUS]
    lines = []
    for name in order:
        entries = sorted(sections.get(name, []), key=lambda entry: entry[0])
        if any(value for _, _, value in entries):
            lines.append((name, ", ".join(f"{label} {_number(value)}" for _, label, value in entries)))
    return lines


def _number(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
