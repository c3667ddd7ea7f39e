"""What a stream that did not come from the config file may open. Config-file streams are trusted
and never checked.

An API client, or anyone who can write a fleet's desired bucket in NATS, could otherwise make the
service read local files, devices and FIFOs, or probe the networks the service can reach (the
failure reasons would tell open ports from closed). `SourcePolicy.admit` is called before an API
stream is accepted and, for every untrusted stream, again before each connect of its source
(realtime.sources.supervisor); `check_form` alone, which touches neither a file nor the network,
before a fleet worker claims a stream from the bucket and before a file path is parsed:

- network schemes only (rtsp, rtsps, http, https), unless `local_dirs` lists directories:
  then local files under them, regular files only (no FIFOs, devices, directories), never
  under /proc, /sys or /dev, wherever a symlink points;
- the host must resolve to addresses the service may reach for a client: private networks (RFC 1918,
  ULA, carrier-grade NAT: where nearly every camera lives) unless `allow_private_hosts` is turned
  off; loopback, link-local (cloud metadata at 169.254.169.254 and fd00:ec2::254 included),
  multicast, unspecified and reserved addresses only with `allow_local_hosts`; and never one of the
  service's own listening ports on one of its own addresses (`own_ports`).

Refusals say what rule applies, never whether a file exists outside the allowed directories.
Limits: the name is resolved before each connect, and the backend resolves it again itself (a
DNS answer that changes in between is not seen); an HTTP server that redirects is not checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from realtime.sources.spec import InvalidSource, SourceSpec, parse_source

NETWORK_SCHEMES = ("rtsp", "rtsps", "http", "https")
SYSTEM_DIRS = (Path("/proc"), Path("/sys"), Path("/dev"))
RESOLVE_TIMEOUT_S = 5.0

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class SourceNotAllowed(InvalidSource):
    """The source is valid but an API client may not use it (`sources` settings)."""


METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")


def local_reason(address: IpAddress) -> str | None:
    """Why the service must not send to `address` for a client unless its operator said so (this
    machine, its link, cloud metadata, groups, nothing), or None. Private networks are not local."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in METADATA_ADDRESSES:
        return "cloud metadata"
    if address.is_unspecified or (isinstance(address, ipaddress.IPv4Address) and address in THIS_NETWORK):
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_reserved:
        return "reserved"
    return None


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    local_dirs: tuple[Path, ...] = ()  # resolved absolute directories; empty: no local files
    allow_private_hosts: bool = True  # RFC 1918, ULA, CGNAT: where cameras live
    allow_local_hosts: bool = False  # loopback, link-local, metadata, multicast, unspecified, reserved
    # The service's listening ports, never a source on its own host; filled in once it listens.
    own_ports: set[int] = field(default_factory=set)

    async def admit(self, url: str) -> SourceSpec:
        """The parsed source if an API client may use it; SourceNotAllowed (or InvalidSource) if not."""
        self.check_form(url)
        spec = parse_source(url)
        if spec.is_file:
            assert spec.path is not None
            self._check_file(spec.path)
        else:
            await self._check_host(spec)
        return spec

    def check_form(self, url: object) -> None:
        """The checks that touch neither the network nor a file outside `local_dirs`: a local path
        outside them is refused whether or not it exists."""
        if not isinstance(url, str):
            return  # the settings model reports the type
        text = url.strip()
        scheme, sep, _ = text.partition("://")
        if sep and scheme.lower() in NETWORK_SCHEMES:
            return
        if sep and scheme.lower() != "file":
            return  # parse_source names the supported schemes
        if not self.local_dirs:
            raise SourceNotAllowed(
                "local files are not allowed for streams added over the API: use an rtsp(s):// or http(s):// URL "
                "(an operator may allow directories with sources.local_dirs)"
            )
        path = Path(os.path.realpath(Path(text).expanduser() if not sep else Path(_file_url_path(text))))
        if not any(path.is_relative_to(directory) for directory in self.local_dirs) or _is_system(path):
            raise SourceNotAllowed(f"local files are allowed only under sources.local_dirs ({self._dirs()})")

    def _check_file(self, path: Path) -> None:
        real = Path(os.path.realpath(path))
        if not any(real.is_relative_to(directory) for directory in self.local_dirs) or _is_system(real):
            raise SourceNotAllowed(f"local files are allowed only under sources.local_dirs ({self._dirs()})")
        try:
            mode = os.stat(real).st_mode
        except OSError:
            raise InvalidSource("the file cannot be read") from None
        if not stat.S_ISREG(mode):
            raise SourceNotAllowed("not a regular file (FIFOs, devices and sockets are not allowed)")

    async def _check_host(self, spec: SourceSpec) -> None:
        if self.allow_private_hosts and self.allow_local_hosts and not self.own_ports:
            return  # nothing to judge: the backend resolves the name itself
        addresses = await _resolve(spec.host, spec.port)
        if not addresses:
            raise SourceNotAllowed(f"host {spec.host} does not resolve")
        for address in addresses:
            reason = self._refused(address, spec.port)
            if reason is not None:
                raise SourceNotAllowed(f"host {spec.host} resolves to {reason}")

    def _refused(self, address: IpAddress, port: int) -> str | None:
        local = local_reason(address)
        if port and port in self.own_ports and (local in ("loopback", "unspecified") or _is_own(address)):
            return "this service's own port (never a source)"
        if local is not None and not self.allow_local_hosts:
            article = "an" if local[0] in "aeiou" else "a"
            return (f"{article} {local} address (an operator may allow loopback, link-local and other local "
                    "addresses with sources.allow_local_hosts)")
        if local is None and not _is_public(address) and not self.allow_private_hosts:
            return "a private address (sources.allow_private_hosts is off)"
        return None

    def _dirs(self) -> str:
        return ", ".join(str(d) for d in self.local_dirs)


def _file_url_path(url: str) -> str:
    return unquote(urlsplit(url).path)


def _is_system(path: Path) -> bool:
    return any(path == d or path.is_relative_to(d) for d in SYSTEM_DIRS)


def _is_own(address: IpAddress) -> bool:
    """One of this machine's own addresses (as its host name resolves)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        return False
    own = set()
    for info in infos:
        try:
            own.add(ipaddress.ip_address(str(info[4][0]).partition("%")[0]))
        except ValueError:
            continue
    return address in own


def _is_public(address: IpAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


async def _resolve(host: str, port: int) -> list[IpAddress]:
    """Every address `host` resolves to; [] when it does not resolve (in time)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_S):
            infos = await loop.getaddrinfo(host, port or None, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError, UnicodeError):
        return []
    addresses: list[IpAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        try:
            addresses.append(ipaddress.ip_address(str(sockaddr[0]).partition("%")[0]))
        except ValueError:
            return []  # an address we cannot judge is not a public one
    return addresses
