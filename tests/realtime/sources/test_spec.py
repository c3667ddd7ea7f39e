from __future__ import annotations

from pathlib import Path

import pytest

from realtime.sources import InvalidSource, parse_source
from realtime.sources.spec import MAX_SOURCE_LENGTH


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


@pytest.mark.parametrize(
    "url",
    [
        "rtsp://host/a\r\nX-Injected: yes\r\nCSeq: 99\r\n\r\nTEARDOWN rtsp://host/other",
        "rtsp://host/a\nb",
        "http://host/a\x00b",
        "rtsp://host/a b",
        "rtsp://host/a\tb",
        "rtsp://host/a\u2028b",  # a Unicode line separator
        "rtsp://host/a\u200bb",  # zero-width space (a format character)
        "rtsp://host/a%0D%0AX-Injected:%20yes",  # decoded by some backends (digest user names)
        "rtsp://us%0aer:pw@host/a",
        "/tmp/clip\n.mp4",
    ],
)
def test_control_characters_and_whitespace_are_refused(url: str) -> None:
    with pytest.raises(InvalidSource, match="^[^\n\r]*$") as info:
        parse_source(url)
    assert "control character" in str(info.value) or "whitespace" in str(info.value)
    assert "Injected" not in str(info.value)  # the refused text is not echoed


def test_source_length_is_capped() -> None:
    with pytest.raises(InvalidSource, match=f"at most {MAX_SOURCE_LENGTH}"):
        parse_source("rtsp://host/" + "a" * MAX_SOURCE_LENGTH)
    assert parse_source("rtsp://host/" + "a" * (MAX_SOURCE_LENGTH - 12)).kind == "rtsp"


def test_a_space_in_a_file_path_is_fine(tmp_path: Path) -> None:
    clip = tmp_path / "my clips" / "front door.mp4"
    clip.parent.mkdir()
    clip.write_bytes(b"\0")
    assert parse_source(str(clip)).path == clip


def test_redaction_follows_the_url_structure_not_substrings() -> None:
    """A one-letter password used to be replaced wherever the letter was: "refused ***y 127.0.0.1"."""
    spec = parse_source("rtsp://a:b@127.0.0.1:1/x")
    assert spec.display == "rtsp://a:***@127.0.0.1:1/x"
    assert spec.redact("connection refused by 127.0.0.1:1") == "connection refused by 127.0.0.1:1"
    shown = "cannot open rtsp://a:***@127.0.0.1:1/x: refused"
    assert spec.redact("cannot open rtsp://a:b@127.0.0.1:1/x: refused") == shown
    assert spec.redact("auth a:b@127.0.0.1 failed") == "auth a:***@127.0.0.1 failed"


@pytest.mark.parametrize(
    ("url", "display"),
    [
        ("rtsp://cam/s?password=hunter2&ch=1", "rtsp://cam/s?password=***&ch=1"),
        ("https://cam/live.m3u8?TOKEN=abc&Sig=xyz&x=2", "https://cam/live.m3u8?TOKEN=***&Sig=***&x=2"),
        ("https://b/c.mp4?X-Amz-Signature=f00d&X-Amz-Credential=AK%2F1", "https://b/c.mp4?X-Amz-Signature=***&X-Amz-Credential=***"),
        ("http://cam/v?user=bob&pwd=1&passwd=2&pass=3&auth=4&key=5&api_key=6&secret=7&access_token=8",
         "http://cam/v?user=bob&pwd=***&passwd=***&pass=***&auth=***&key=***&api_key=***&secret=***&access_token=***"),
        ("rtsp://cam/s?monkey=1&keyframe=2", "rtsp://cam/s?monkey=1&keyframe=2"),  # names that merely contain one
        ("https://cam/x#access_token=abc", "https://cam/x#access_token=***"),
        # A user name without a password is how tokens are passed: hidden whole.
        ("https://ghp_0123456789abcdef@cam/x", "https://***@cam/x"),
        ("rtsp://admin@cam/x", "rtsp://***@cam/x"),
        ("rtsp://admin:@cam/x", "rtsp://admin:***@cam/x"),
    ],
)
def test_query_secrets_and_lone_user_names_are_hidden(url: str, display: str) -> None:
    spec = parse_source(url)
    assert spec.display == display
    assert spec.url == url  # the backend still gets them
    assert spec.redact(f"error reading {url}: 401") == f"error reading {display}: 401"


def test_redact_replaces_long_secrets_standing_alone_only() -> None:
    spec = parse_source("rtsp://cam/s?token=0123456789abcdef&key=ab")
    assert spec.redact("bad token 0123456789abcdef.") == "bad token ***."
    assert spec.redact("xx0123456789abcdefyy") == "xx0123456789abcdefyy"  # part of another word
    assert spec.redact("a key ab in a table") == "a key ab in a table"  # too short to search for alone
    assert spec.redact("GET /s?token=0123456789abcdef&key=ab") == "GET /s?token=***&key=***"
    assert "0123456789abcdef" not in repr(spec)
