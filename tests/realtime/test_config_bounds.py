"""Issue 23, Medium 5 and Low: what a config (or an API body) may cost, and numbers with a range.

A few KiB of YAML aliases must not expand into gigabytes of validation; each distinct polygon is
checked once; `http.max_streams` is checked before any stream; an error lists a bounded number of
problems; every number has both bounds, and one no setting could hold is refused by key, never
with a traceback or Python's own conversion text."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from pipelines.rules import specs
from realtime.config import MAX_PROBLEMS_SHOWN, ConfigError, load_config
from realtime.http.api import read_json_object, validate_stream
from realtime.http.errors import ApiError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vidsentry.yaml"
    path.write_text(text)
    return path


def circle(points: int, r: float = 200.0, cx: float = 300.0, cy: float = 300.0, turn: float = 0.0) -> str:
    """A convex (simple) polygon of `points` corners as a YAML flow list."""
    corners = []
    for k in range(points):
        a = 2 * math.pi * k / points + turn
        corners.append(f"[{cx + r * math.cos(a):.3f}, {cy + r * math.sin(a):.3f}]")
    return "[" + ", ".join(corners) + "]"


def alias_bomb(clip: Path, copies: int = 1000) -> str:
    """The issue's shape: one stream's 64 zone rules of 256-point polygons, reused `copies` times."""
    rules = "\n".join(
        f"    - {{id: z{i}, type: zone, polygon: {'&p ' + circle(256) if i == 0 else '*p'}}}" for i in range(64)
    )
    streams = "\n".join(f"  - {{id: s{i}, url: *u, rules: *rules}}" for i in range(1, copies))
    head = f"http:\n  max_streams: {copies}\nstreams:\n  - id: s0\n    url: &u {clip}\n    rules: &rules\n"
    return f"{head}{rules}\n{streams}\n"


# -- Medium 5: expansion, repeated polygons, the stream count, the length of an error ---------------

LOAD_BOUNDED = textwrap.dedent(
    """
    import resource, sys, time
    from realtime.config import ConfigError, load_config
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    started = time.monotonic()
    try:
        load_config(sys.argv[1], environ={})
        print("ACCEPTED")
    except ConfigError as exc:
        print("REFUSED", round(time.monotonic() - started, 2), str(exc)[:400])
    except MemoryError:
        print("OUT OF MEMORY", round(time.monotonic() - started, 2))
    print("RSS_MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
    """
)


def test_an_alias_bomb_is_refused_before_it_is_validated(tmp_path: Path, sample_clip: Path) -> None:
    """40 KB that expand to 50 million values: refused in well under a second, naming `streams`,
    in a child process whose address space is capped (today's code needs gigabytes)."""
    path = write(tmp_path, alias_bomb(sample_clip))
    assert path.stat().st_size < 64 * 1024
    baseline = subprocess.run(
        [sys.executable, "-c", "import resource, realtime.config; "
         "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)"],
        capture_output=True, text=True, cwd=ROOT, check=True, timeout=60,
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", LOAD_BOUNDED, str(path), str(4 * 1024**3)],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )
    wall = time.monotonic() - started
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines and lines[0].startswith("REFUSED"), (result.stdout, result.stderr[-2000:])
    assert "streams: expands to more than 1,000,000 values" in lines[0]
    assert float(lines[0].split()[1]) < 2.0, lines[0]  # seconds inside load_config
    rss_mb = int(lines[-1].split()[1])
    assert rss_mb < int(baseline.stdout) + 100, (rss_mb, baseline.stdout)  # no more than the imports, near enough
    assert wall < 60


def test_an_alias_that_contains_itself_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"streams\.0: a YAML alias refers to a value that contains it"):
        load_config(write(tmp_path, "streams: &s\n  - *s\n"), environ={})


def test_a_config_that_reuses_aliases_within_the_bound_loads(tmp_path: Path, sample_clip: Path) -> None:
    config = load_config(write(tmp_path, alias_bomb(sample_clip, copies=3)), environ={})
    assert [s.id for s in config.streams] == ["s0", "s1", "s2"]
    assert all(len(s.rules) == 64 for s in config.streams)


def test_each_distinct_polygon_is_checked_once(
    tmp_path: Path, sample_clip: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = specs.is_simple_polygon

    def counting(polygon: Any) -> bool:
        calls.append(len(polygon))
        return real(polygon)

    monkeypatch.setattr(specs, "is_simple_polygon", counting)
    cache_clear = getattr(getattr(specs, "_polygon_problem", None), "cache_clear", None)
    if cache_clear is not None:
        cache_clear()
    square, other = circle(4), circle(5, turn=0.1)
    text = (
        f"streams:\n  - id: a\n    url: {sample_clip}\n    rules: &r\n"
        f"      - {{id: z1, type: zone, polygon: &p {square}}}\n"
        f"      - {{id: z2, type: zone, polygon: *p}}\n"
        f"      - {{id: z3, type: present, zone: *p}}\n"
        f"      - {{id: z4, type: zone, polygon: {other}}}\n"
        f"  - {{id: b, url: {sample_clip}, rules: *r}}\n"
        f"  - {{id: c, url: {sample_clip}, rules: *r}}\n"
    )
    config = load_config(write(tmp_path, text), environ={})
    assert len(config.streams) == 3
    assert sorted(calls) == [4, 5]  # today: 9 checks (3 streams x 3 zones of the alias)


def test_too_many_streams_are_refused_before_any_is_validated(tmp_path: Path) -> None:
    """5,000 streams, each with a bad URL, against max_streams 64: one short line, nothing else."""
    streams = "\n".join(f"  - {{id: s{i}, url: 'ftp://x/{i}'}}" for i in range(5000))
    path = write(tmp_path, f"streams:\n{streams}\n")
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert time.monotonic() - started < 5
    assert str(info.value) == f"{path}: streams: 5000 streams configured, more than http.max_streams (64)"


def test_the_limit_comes_from_the_file(tmp_path: Path, sample_clip: Path) -> None:
    streams = "\n".join(f"  - {{id: s{i}, url: {sample_clip}}}" for i in range(80))
    config = load_config(write(tmp_path, f"http:\n  max_streams: 80\nstreams:\n{streams}\n"), environ={})
    assert len(config.streams) == 80


def test_an_error_lists_a_bounded_number_of_problems(tmp_path: Path) -> None:
    streams = "\n".join(f"  - {{id: s{i}, url: 'ftp://x/{i}', {'k' * 1000}: 1}}" for i in range(60))
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, f"streams:\n{streams}\n"), environ={})
    message = str(info.value)
    assert "\n" not in message and len(message) < 2 * MAX_PROBLEMS_SHOWN * 300 + 200, len(message)
    assert message.count("streams.") == MAX_PROBLEMS_SHOWN and message.endswith("; and 100 more problems")


# -- Low: every number has a range, with a reason -------------------------------------------------


@pytest.mark.parametrize(
    ("stream", "field", "reason"),
    [
        ("detect_fps: 1e308", "streams.0.detect_fps", "less than or equal to 240"),
        ("detect_fps: 1.0e+308", "streams.0.detect_fps", "less than or equal to 240"),
        ("rules: [{id: r, type: count, above: " + "9" * 4000 + "}]", "streams.0.rules.0.above",
         "an integer of 4000 digits is out of range"),
        ("rules: [{id: r, type: count, above: 20000}]", "streams.0.rules.0.count.above", "less than or equal to 10000"),
        ("rules: [{id: r, type: present, for_s: 1e-400}]", "streams.0.rules.0.for_s", "too small for a number"),
        ("rules: [{id: r, type: present, for_s: 1e9}]", "streams.0.rules.0.present.for_s", "less than or equal to"),
        ("rules: [{id: r, type: fall, cooldown_s: 1e12}]", "streams.0.rules.0.fall.cooldown_s", "less than or equal"),
        ("rules: [{id: r, type: line, points: [[0, 0], [1e300, 5]]}]", "streams.0.rules.0.line.points",
         "beyond 100000 pixels"),
    ],
)
def test_a_number_out_of_range_is_refused_by_key(
    tmp_path: Path, sample_clip: Path, stream: str, field: str, reason: str
) -> None:
    path = write(tmp_path, f"streams:\n  - id: a\n    url: {sample_clip}\n    {stream}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    message = str(info.value)
    assert f"{field}: " in message and reason in message, message
    assert "sys.set_int_max_str_digits" not in message


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("http:\n  port: " + "9" * 5000 + "\n", "http.port", "an integer of 5000 digits is out of range"),
        ("http:\n  max_streams: 99999999999\n", "http.max_streams", "less than or equal to"),
        ("nats:\n  connect_timeout_s: 1e400\n", "nats.connect_timeout_s", "Input should be a finite number"),
        ("supervisor:\n  watchdog_s: 1e308\n", "supervisor.watchdog_s", "less than or equal to 3600"),
        ("tracker:\n  max_tracks: 10000000\n", "tracker.max_tracks", "less than or equal to"),
    ],
)
def test_a_setting_out_of_range_is_refused_by_key(tmp_path: Path, text: str, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), environ={})
    assert f"{field}: " in str(info.value) and reason in str(info.value), str(info.value)


def test_ordinary_numbers_still_load(tmp_path: Path, sample_clip: Path) -> None:
    text = (
        f"supervisor:\n  watchdog_s: 2.5\nstreams:\n  - id: a\n    url: {sample_clip}\n    detect_fps: 5\n"
        "    rules: [{id: r, type: count, above: 3, for_s: 1e-3}, {id: f, type: fall, for_s: 0}]\n"
    )
    config = load_config(write(tmp_path, text), environ={})
    assert config.streams[0].detect_fps == 5.0 and config.supervisor.watchdog_s == 2.5


class _Body:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    async def read(self) -> bytes:
        return self.raw


@pytest.mark.parametrize(
    ("raw", "field", "reason"),
    [
        (b'{"id": "a", "rules": [{"id": "r", "type": "count", "above": ' + b"9" * 5000 + b"}]}",
         "rules.0.above", "an integer of 5000 digits is out of range"),
        (b'{"id": "a", "detect_fps": 1e-400}', "detect_fps", "too small for a number"),
    ],
)
def test_an_api_body_with_a_number_no_field_holds_names_the_field(raw: bytes, field: str, reason: str) -> None:
    with pytest.raises(ApiError) as info:
        asyncio.run(read_json_object(_Body(raw)))  # type: ignore[arg-type]
    error = info.value
    assert error.status == 400 and "bad JSON" not in error.error, error.error
    assert error.detail == [{"field": field, "message": error.detail[0]["message"]}]
    assert reason in error.detail[0]["message"] and "sys.set_int_max_str_digits" not in json.dumps(error.detail)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"id": "a", "url": "rtsp://cam/x", "detect_fps": 1e308}, "detect_fps"),
        ({"id": "a", "url": "rtsp://cam/x", "rules": [{"id": "r", "type": "count", "above": 10**3999}]},
         "rules.0.count.above"),
        ({"id": "a", "url": "rtsp://cam/x", "rules": [{"id": "r", "type": "zone", "polygon": [[0, 0], [1e300, 0],
                                                                                           [5, 5]]}]},
         "rules.0.zone.polygon"),
    ],
)
def test_an_api_stream_with_a_number_out_of_range_is_400(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ApiError) as info:
        validate_stream(body)
    assert info.value.status == 400 and field in [p["field"] for p in info.value.detail], info.value.detail

