"""The source policy for API-added streams on its own: addresses judged without the network."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from realtime.sources import InvalidSource
from realtime.sources.policy import SourceNotAllowed, SourcePolicy


@pytest.mark.parametrize("url", ["rtsp://8.8.8.8/x", "https://[2001:4860:4860::8888]/live.m3u8", "RTSPS://1.1.1.1:322/a"])
async def test_public_addresses_are_admitted(url: str) -> None:
    assert (await SourcePolicy().admit(url)).is_network


@pytest.mark.parametrize(
    "url",
    [
        "rtsp://10.1.2.3/x",
        "rtsp://192.168.1.64:554/Streaming/Channels/101",
        "rtsp://172.16.0.5/x",
        "rtsp://100.64.0.1/x",  # carrier-grade NAT
        "rtsp://192.0.2.1/x",  # documentation range
        "rtsp://[fd00::1]/x",
        "rtsp://[::ffff:10.0.0.1]/x",
    ],
)
async def test_private_networks_are_admitted_unless_turned_off(url: str) -> None:
    assert (await SourcePolicy().admit(url)).is_network
    with pytest.raises(SourceNotAllowed, match="sources.allow_private_hosts is off"):
        await SourcePolicy(allow_private_hosts=False).admit(url)


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("rtsp://127.0.0.2/x", "loopback"),
        ("rtsp://[::ffff:127.0.0.1]/x", "loopback"),
        ("rtsp://0.0.0.0/x", "unspecified"),
        ("rtsp://224.0.0.1/x", "multicast"),
        ("rtsp://[fe80::1]/x", "link-local"),
        ("rtsp://169.254.169.254/x", "cloud metadata"),
        ("rtsp://[fd00:ec2::254]/x", "cloud metadata"),
        ("rtsp://240.0.0.1/x", "reserved"),
    ],
)
async def test_this_machine_and_its_link_need_allow_local_hosts(url: str, what: str) -> None:
    with pytest.raises(SourceNotAllowed, match=f"an? {what} address .*sources.allow_local_hosts"):
        await SourcePolicy().admit(url)
    assert (await SourcePolicy(allow_local_hosts=True).admit(url)).is_network


async def test_the_services_own_port_is_never_a_source() -> None:
    policy = SourcePolicy(allow_local_hosts=True, own_ports={8080})
    with pytest.raises(SourceNotAllowed, match="this service's own port"):
        await policy.admit("http://127.0.0.1:8080/api/streams")
    assert (await policy.admit("rtsp://127.0.0.1:8554/x")).is_network


async def test_a_bad_url_is_reported_as_such_not_as_a_policy_refusal() -> None:
    with pytest.raises(InvalidSource, match="unsupported source scheme") as info:
        await SourcePolicy().admit("ftp://8.8.8.8/x")
    assert not isinstance(info.value, SourceNotAllowed)


def test_local_files_under_local_dirs(sample_clip: Path) -> None:
    with pytest.raises(SourceNotAllowed, match="local files are not allowed"):
        asyncio.run(SourcePolicy().admit(str(sample_clip)))
    policy = SourcePolicy(local_dirs=(sample_clip.parent.resolve(),))
    assert asyncio.run(policy.admit(sample_clip.as_uri())).path == sample_clip.resolve()
    with pytest.raises(SourceNotAllowed, match="only under sources.local_dirs"):
        asyncio.run(policy.admit("/proc/self/status"))
