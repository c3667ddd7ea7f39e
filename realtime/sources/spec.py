"""What a source URL means: parse and validate it once, before anything connects.

`parse_source` accepts a local path (or a file:// URL), rtsp://, rtsps://, http:// and
https:// URLs, at most MAX_SOURCE_LENGTH characters. Control characters (raw or
percent-encoded) are refused everywhere, and whitespace inside a URL too: a backend would
write them into its requests, so a CR/LF would add request lines of the caller's choosing.

The returned `SourceSpec` carries a `display` form of the URL, the only form that may reach
logs, status reasons or errors. Secrets are found by the URL's structure, never by searching
for their text: the password of `user:password@` becomes `***` (the user name stays); a user
name without a password is hidden whole (`***@`), since that is how tokens are usually
passed; and so are the values of query (or fragment) parameters whose name is a secret's
(`password`, `token`, `key`, `signature`, ... and names ending in one, such as
`X-Amz-Signature` or `auth_token`). `SourceSpec.redact` rewrites a backend's error text:
the whole URL (raw or percent-decoded), its userinfo and its secret parameters are replaced
by their display forms, and a secret of 8 or more characters standing alone is replaced too;
shorter secrets are never searched for on their own (that would garble the text and show
which letters the secret has).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from realtime.errors import ServiceError

SourceKind = Literal["file", "rtsp", "http"]

_NETWORK_SCHEMES: dict[str, SourceKind] = {
    "rtsp": "rtsp",
    "rtsps": "rtsp",
    "http": "http",
    "https": "http",
}
SUPPORTED = "a file path, file://, rtsp://, rtsps://, http:// or https://"
REDACTED = "***"
MAX_SOURCE_LENGTH = 2048
# Query / fragment parameters whose values are secrets (compared lower-case, also as the last
# word of a longer name: `X-Amz-Signature`, `auth_token`, `client_secret`).
SECRET_PARAMETERS = frozenset(
    {
        "password", "passwd", "pass", "pwd", "token", "access_token", "auth", "key", "api_key", "apikey",
        "secret", "signature", "sig", "credential", "credentials",
    }
)
MIN_BARE_SECRET = 8  # shorter secrets are only replaced as part of the URL, userinfo or parameter
_CONTROL = frozenset({"Cc", "Cf", "Zl", "Zp"})  # control, format (bidi, zero-width), line separators


class InvalidSource(ServiceError, ValueError):
    """The source cannot be used as given (bad scheme, missing file, ...)."""


@dataclass(frozen=True, slots=True)
class SourceSpec:
    url: str = field(repr=False)  # what the backend opens (may hold a password): never log it
    kind: SourceKind
    path: Path | None = None  # set for files
    display: str = ""  # the URL with its secrets replaced by ***: safe for logs
    # (text, replacement) pairs that `redact` applies, longest first; bare secrets are regexes.
    replacements: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)
    bare_secrets: tuple[re.Pattern[str], ...] = field(default=(), repr=False, compare=False)

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @property
    def is_network(self) -> bool:
        return self.kind != "file"

    @property
    def host(self) -> str:
        """The host of a network source, "" for files."""
        return "" if self.path is not None else urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        """The port of a network source (the scheme's default when none is given), 0 for files."""
        if self.path is not None:
            return 0
        parts = urlsplit(self.url)
        return parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 0)

    @property
    def host_port(self) -> str:
        """`host:port` of a network source (default port filled in), "" for files."""
        host, port = self.host, self.port
        return f"{host}:{port}" if port else host

    def redact(self, text: str) -> str:
        """`text` (a backend's error, a traceback) with every form of the URL's secrets replaced."""
        for secret, shown in self.replacements:
            text = text.replace(secret, shown)
        for pattern in self.bare_secrets:
            text = pattern.sub(REDACTED, text)
        return text

    def __str__(self) -> str:
        return self.display


_DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322, "http": 80, "https": 443}


def parse_source(url: str) -> SourceSpec:
    """Validate `url` and say what kind of source it is. Raises InvalidSource."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidSource(f"empty source: give {SUPPORTED}")
    _check_characters(url, "source")
    text = url.strip()
    scheme, sep, _ = text.partition("://")
    if not sep:
        return _file_spec(Path(text).expanduser(), text)
    scheme = scheme.lower()
    _check_url_characters(text)
    if scheme == "file":
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise InvalidSource("file URL with a remote host: give a local path")
        return _file_spec(Path(unquote(parts.path)), text)
    kind = _NETWORK_SCHEMES.get(scheme)
    if kind is None:
        shown = scheme[:16] + "://" if scheme.isascii() and scheme.isalnum() else "that scheme"
        raise InvalidSource(f"unsupported source scheme {shown!r}: give {SUPPORTED}")
    return _network_spec(text, kind)


def _check_characters(text: str, what: str) -> None:
    if len(text) > MAX_SOURCE_LENGTH:
        raise InvalidSource(f"{what} is {len(text)} characters long: at most {MAX_SOURCE_LENGTH} are allowed")
    for index, char in enumerate(text):
        if unicodedata.category(char) in _CONTROL:
            raise InvalidSource(f"control character U+{ord(char):04X} at position {index}: not allowed in a {what}")


def _check_url_characters(text: str) -> None:
    for index, char in enumerate(text):
        if char.isspace():
            raise InvalidSource(f"whitespace at position {index}: not allowed in a URL (write a space as %20)")
    decoded = unquote(text, errors="replace")
    for char in decoded:
        if unicodedata.category(char) in _CONTROL:
            raise InvalidSource(f"percent-encoded control character U+{ord(char):04X}: not allowed in a URL")


def _file_spec(path: Path, given: str) -> SourceSpec:
    if path.is_dir():
        raise InvalidSource(f"source is a directory, not a media file: {given}")
    if not path.exists():
        raise InvalidSource(f"no such file: {given}")
    absolute = path.resolve()
    return SourceSpec(url=str(absolute), kind="file", path=absolute, display=str(absolute))


def _network_spec(url: str, kind: SourceKind) -> SourceSpec:
    parts = urlsplit(url)
    display, replacements, bare = _redacted(url, parts)
    try:
        host = parts.hostname
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise InvalidSource(f"malformed {parts.scheme} URL: {exc}") from None
    if not host:
        raise InvalidSource(f"{parts.scheme} URL without a host: {display}")
    return SourceSpec(
        url=url, kind=kind, path=None, display=display, replacements=replacements, bare_secrets=bare
    )


def _redacted(url: str, parts: SplitResult) -> tuple[str, tuple[tuple[str, str], ...], tuple[re.Pattern[str], ...]]:
    """The display form of `url`, the replacements that turn its secret parts into their display
    forms, and the patterns of its long secrets standing alone."""
    pairs: dict[str, str] = {}
    secrets: set[str] = set()
    userinfo, at, hostport = parts.netloc.rpartition("@")
    netloc = parts.netloc
    if at and userinfo:
        user, colon, password = userinfo.partition(":")
        shown_userinfo = f"{user}:{REDACTED}" if colon else REDACTED  # a lone user name may be a token
        secrets.update((password, unquote(password)) if colon else (user, unquote(user)))
        pairs[userinfo + "@"] = pairs[unquote(userinfo) + "@"] = shown_userinfo + "@"
        netloc = f"{shown_userinfo}@{hostport}"
    query = _redacted_parameters(parts.query, pairs, secrets)
    fragment = _redacted_parameters(parts.fragment, pairs, secrets)
    display = url
    if (netloc, query, fragment) != (parts.netloc, parts.query, parts.fragment):
        rebuilt = urlunsplit(parts._replace(netloc=netloc, query=query, fragment=fragment))
        display = url[: len(parts.scheme)] + rebuilt[len(parts.scheme) :]  # the scheme as written
    if display != url:
        pairs[url] = pairs[unquote(url)] = display
    ordered = tuple(sorted(((k, v) for k, v in pairs.items() if k and k != v), key=lambda kv: -len(kv[0])))
    bare = tuple(
        re.compile(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])")
        for secret in sorted(secrets, key=len, reverse=True)
        if len(secret) >= MIN_BARE_SECRET
    )
    return display, ordered, bare


def _redacted_parameters(text: str, pairs: dict[str, str], secrets: set[str]) -> str:
    """`a=1&token=xyz` -> `a=1&token=***`, recording what was replaced."""
    if not text:
        return text
    shown = []
    for item in text.split("&"):
        name, eq, value = item.partition("=")
        if eq and value and is_secret_parameter(unquote(name)):
            safe = f"{name}={REDACTED}"
            pairs[item] = pairs[unquote(item)] = safe
            secrets.update((value, unquote(value)))
            shown.append(safe)
        else:
            shown.append(item)
    return "&".join(shown)


def is_secret_parameter(name: str) -> bool:
    lowered = name.strip().lower()
    words = [word for word in re.split(r"[^a-z0-9]+", lowered) if word]
    return lowered in SECRET_PARAMETERS or bool(words) and words[-1] in SECRET_PARAMETERS
