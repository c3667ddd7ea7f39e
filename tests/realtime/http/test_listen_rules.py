"""Where serve listens and when it insists on a token; how the token is read."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from realtime.cli.errors import CommandError
from realtime.cli.serve import is_loopback, plan_listen
from realtime.config import Config, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[3]


def args(**values: object) -> argparse.Namespace:
    return argparse.Namespace(**{"host": None, "port": None, "allow_unauthenticated": False, **values})


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost", "LOCALHOST."])
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)
    assert plan_listen(args(host=host), Config(), {}).token is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.0.2.7", "camera-host", "localhost.example.com"])
def test_anything_else_needs_a_token_or_an_explicit_opt_out(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(CommandError) as info:
        plan_listen(args(host=host), Config(), {})
    assert info.value.code == 2 and "--allow-unauthenticated" in str(info.value)
    assert plan_listen(args(host=host, allow_unauthenticated=True), Config(), {}).token is None
    config = Config.model_validate({"http": {"allow_unauthenticated": True}})
    assert plan_listen(args(host=host), config, {}).host == host


def test_token_sources_and_precedence() -> None:
    config = Config.model_validate({"http": {"host": "0.0.0.0", "port": 9000, "api_token": "from-file"}})
    plan = plan_listen(args(), config, {})
    assert (plan.host, plan.port, plan.token) == ("0.0.0.0", 9000, "from-file")
    assert plan_listen(args(), config, {"VIDSENTRY_API_TOKEN": "from-env\n"}).token == "from-env"
    assert plan_listen(args(), config, {"VIDSENTRY_API_TOKEN": "  "}).token == "from-file"
    assert plan_listen(args(host="127.0.0.1", port=0), config, {}).port == 0  # flags win
    assert "from-file" not in repr(config) and "from-file" not in repr(plan)


def test_an_empty_configured_token_means_none() -> None:
    assert Config.model_validate({"http": {"api_token": ""}}).http.api_token is None


def test_the_sample_config_has_the_http_and_outbox_settings(sample_clip: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    config = load_config(ROOT / "samples" / "vidsentry.yaml", environ={})
    assert (config.http.host, config.http.port, config.http.api_token) == ("127.0.0.1", 8080, None)
    assert config.nats.outbox_dir is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("http:\n  prot: 8080\n", "http.prot: unknown key"),
        ("http:\n  port: 70000\n", "http.port"),
        ("http:\n  sse_queue_events: 0\n", "http.sse_queue_events"),
        ("http:\n  allow_unauthenticated: maybe\n", "http.allow_unauthenticated"),
        ("nats:\n  outbox_max_events: 0\n", "nats.outbox_max_events"),
        ("nats:\n  outbox_max_bytes: -5\n", "nats.outbox_max_bytes"),
        ("streams:\n  - id: a\n    url: rtsp://cam/1\n    fps: 3\n", "streams.0.fps: unknown key"),
    ],
)
def test_new_keys_are_validated_by_name(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert needle in str(info.value)
