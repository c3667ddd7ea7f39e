"""Config loading: valid files, env overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from realtime.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vidsentry.yaml"
    path.write_text(text)
    return path


def test_sample_config_loads(sample_clip: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    config = load_config(ROOT / "samples" / "vidsentry.yaml", environ={})
    assert [s.id for s in config.streams] == ["plaza"]
    assert config.nats.url is None and config.detector.engine == "auto"


def test_empty_config_is_valid(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), environ={})
    assert config.streams == []


def test_env_overrides_nested_keys(tmp_path: Path) -> None:
    path = write(tmp_path, "detector:\n  conf: 0.3\n")
    config = load_config(path, environ={"VIDSENTRY_DETECTOR__CONF": "0.5", "VIDSENTRY_NATS__URL": "nats://bus:4222"})
    assert config.detector.conf == 0.5 and config.nats.url == "nats://bus:4222"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("detecter:\n  conf: 0.3\n", "detecter: unknown key"),
        ("detector:\n  conf: 3\n", "detector.conf"),
        ("detector:\n  engine: cuda\n", "detector.engine"),
        ("streams:\n  - id: bad id\n    url: rtsp://cam/1\n", "streams.0.id"),
        ("streams:\n  - id: a\n    url: ftp://cam/1\n", "streams.0.url"),
        ("streams:\n  - id: a\n", "streams.0.url"),
        ("streams:\n  - {id: a, url: rtsp://c/1}\n  - {id: a, url: rtsp://c/2}\n", "duplicate stream id"),
        ("nats:\n  url: http://bus\n", "nats.url"),
        (
            "streams:\n  - id: a\n    url: rtsp://c/1\n    rules:\n"
            "      - {id: r, type: fall}\n      - {id: r, type: fall}\n",
            "streams.0.rules: duplicate rule id 'r'",
        ),
        ("- just\n- a list\n", "top level"),
        ("detector: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), environ={})
    assert needle in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_bad_env_override_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="supervisor.watchdog_s"):
        load_config(write(tmp_path, ""), environ={"VIDSENTRY_SUPERVISOR__WATCHDOG_S": "-1"})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml", environ={})
