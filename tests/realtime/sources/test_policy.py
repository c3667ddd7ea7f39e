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
        "rtsp://127.0.0.2/x",
        "rtsp://0.0.0.0/x",
        "rtsp://100.64.0.1/x",  # carrier-grade NAT
        "rtsp://224.0.0.1/x",  # multicast
        "rtsp://192.0.2.1/x",  # documentation range
        "rtsp://[fe80::1]/x",
        "rtsp://[fd00::1]/x",
        "rtsp://[::ffff:10.0.0.1]/x",
    ],
)
async def test_other_addresses_need_allow_private_hosts(url: str) -> None:
    with pytest.raises(SourceNotAllowed, match="sources.allow_private_hosts"):
        await SourcePolicy().admit(url)
    assert (await SourcePolicy(allow_private_hosts=True).admit(url)).is_network


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
