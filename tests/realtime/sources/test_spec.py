from __future__ import annotations

from pathlib import Path

import pytest

from realtime.sources import InvalidSource, parse_source


def test_file_path_and_file_url(sample_clip: Path) -> None:
    spec = parse_source(str(sample_clip))
    assert (spec.kind, spec.path, spec.url) == ("file", sample_clip.resolve(), str(sample_clip.resolve()))
    assert parse_source(sample_clip.resolve().as_uri()).path == sample_clip.resolve()


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("rtsp://127.0.0.1:8554/cam", "rtsp"),
        ("RTSPS://camera.local/stream", "rtsp"),
        ("http://example.com/live.m3u8", "http"),
        ("https://example.com/clip.mp4", "http"),
    ],
)
def test_network_schemes(url: str, kind: str) -> None:
    spec = parse_source(url)
    assert (spec.kind, spec.path, spec.url, spec.display) == (kind, None, url, url)


def test_password_is_redacted_everywhere() -> None:
    spec = parse_source("rtsp://admin:p%40ss:w0rd@10.0.0.7:554/Streaming/101")
    assert spec.display == "rtsp://admin:***@10.0.0.7:554/Streaming/101"
    assert "p%40ss" not in repr(spec) and "w0rd" not in repr(spec)
    assert spec.url.startswith("rtsp://admin:p%40ss:w0rd@")  # the backend still gets it
    assert spec.redact("error for p@ss:w0rd and p%40ss:w0rd") == "error for *** and ***"
    assert spec.host_port == "10.0.0.7:554"


def test_default_port_in_host_port() -> None:
    assert parse_source("rtsp://cam.example/x").host_port == "cam.example:554"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty source"),
        ("   ", "empty source"),
        ("ftp://host/file.mp4", "unsupported source scheme 'ftp://'"),
        ("udp://239.0.0.1:1234", "rtsp://"),  # the message lists what works
        ("rtsp:///nohost", "without a host"),
        ("rtsp://:pw@/x", "without a host"),
        ("rtsp://host:99999/x", "malformed rtsp URL"),
        ("/nonexistent/clip.mp4", "no such file"),
        ("file:///nonexistent/clip.mp4", "no such file"),
    ],
)
def test_invalid_sources(url: str, message: str) -> None:
    with pytest.raises(InvalidSource, match="^[^\n]*$") as info:
        parse_source(url)
    assert message in str(info.value)


def test_directory_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidSource, match="directory"):
        parse_source(str(tmp_path))


def test_invalid_source_is_a_value_error() -> None:
    assert issubclass(InvalidSource, ValueError)


def test_password_not_in_invalid_source_message() -> None:
    with pytest.raises(InvalidSource) as info:
        parse_source("rtsp://user:hunter2@/x")
    assert "hunter2" not in str(info.value)
