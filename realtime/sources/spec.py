"""What a source URL means: parse and validate it once, before anything connects.

`parse_source` accepts a local path (or a file:// URL), rtsp://, rtsps://, http:// and
https:// URLs. The returned `SourceSpec` carries a `display` form of the URL with any
password replaced by `***`; only that form may reach logs, status reasons or errors
(`SourceSpec.redact` scrubs the secret out of arbitrary text, such as a backend's error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit, urlunsplit

SourceKind = Literal["file", "rtsp", "http"]

_NETWORK_SCHEMES: dict[str, SourceKind] = {
    "rtsp": "rtsp",
    "rtsps": "rtsp",
    "http": "http",
    "https": "http",
}
SUPPORTED = "a file path, file://, rtsp://, rtsps://, http:// or https://"
REDACTED = "***"


class InvalidSource(ValueError):
    """The source cannot be used as given (bad scheme, missing file, ...)."""


@dataclass(frozen=True, slots=True)
class SourceSpec:
    url: str = field(repr=False)  # what the backend opens (may hold a password): never log it
    kind: SourceKind
    path: Path | None = None  # set for files
    display: str = ""  # the URL with its password replaced by ***: safe for logs
    secrets: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @property
    def is_network(self) -> bool:
        return self.kind != "file"

    @property
    def host_port(self) -> str:
        """`host:port` of a network source (default port filled in), "" for files."""
        if self.path is not None:
            return ""
        parts = urlsplit(self.url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 0)
        host = parts.hostname or ""
        return f"{host}:{port}" if port else host

    def redact(self, text: str) -> str:
        """`text` with the URL's password (raw or percent-decoded) replaced by ***."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def __str__(self) -> str:
        return self.display


_DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322, "http": 80, "https": 443}


def parse_source(url: str) -> SourceSpec:
    """Validate `url` and say what kind of source it is. Raises InvalidSource."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidSource(f"empty source: give {SUPPORTED}")
    text = url.strip()
    scheme, sep, _ = text.partition("://")
    if not sep:
        return _file_spec(Path(text).expanduser(), text)
    scheme = scheme.lower()
    if scheme == "file":
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise InvalidSource(f"file URL with a remote host {parts.netloc!r}: give a local path")
        return _file_spec(Path(unquote(parts.path)), text)
    kind = _NETWORK_SCHEMES.get(scheme)
    if kind is None:
        raise InvalidSource(f"unsupported source scheme {scheme + '://'!r}: give {SUPPORTED}")
    return _network_spec(text, kind)


def _file_spec(path: Path, given: str) -> SourceSpec:
    if path.is_dir():
        raise InvalidSource(f"source is a directory, not a media file: {given}")
    if not path.exists():
        raise InvalidSource(f"no such file: {given}")
    absolute = path.resolve()
    return SourceSpec(url=str(absolute), kind="file", path=absolute, display=str(absolute))


def _network_spec(url: str, kind: SourceKind) -> SourceSpec:
    parts = urlsplit(url)
    try:
        host = parts.hostname
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise InvalidSource(f"malformed {parts.scheme} URL: {exc}") from None
    secrets: tuple[str, ...] = ()
    display = url
    if parts.password is not None:
        raw_password = parts.netloc.rpartition("@")[0].partition(":")[2]
        secrets = tuple(sorted({s for s in (raw_password, unquote(raw_password)) if s}, key=len, reverse=True))
        netloc = f"{parts.username}:{REDACTED}@{parts.netloc.rpartition('@')[2]}"
        display = urlunsplit(parts._replace(netloc=netloc))
    if not host:
        raise InvalidSource(f"{parts.scheme} URL without a host: {display}")
    return SourceSpec(url=url, kind=kind, path=None, display=display, secrets=secrets)
