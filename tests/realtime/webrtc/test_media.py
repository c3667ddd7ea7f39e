"""The pieces of a session's media path that need no peer: limits, draining, the timeline, ICE."""

from __future__ import annotations

import asyncio

import pytest

from realtime.config import IceServerSettings
from realtime.webrtc.ice import rtc_configuration, without_mdns_candidates
from realtime.webrtc.media import SessionClock, VideoLimits, _newest, fit


@pytest.mark.parametrize(
    ("size", "expected"),
    [((640, 480), (640, 480)), ((3840, 2160), (1920, 1080)), ((1080, 1920), (606, 1080)), ((1921, 1081), (1918, 1080))],
)
def test_fit_keeps_the_aspect_ratio_within_the_limits(size: tuple[int, int], expected: tuple[int, int]) -> None:
    assert fit(*size, VideoLimits(1920, 1080, 30)) == expected


class QueuedTrack:
    def __init__(self, items: list[object]) -> None:
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        for item in items:
            self._queue.put_nowait(item)


async def test_only_the_newest_queued_frame_is_kept() -> None:
    track = QueuedTrack(["f2", "f3", "f4"])
    assert _newest(track, "f1") == ("f4", 3, False)  # type: ignore[arg-type]
    assert track._queue.empty()
    ending = QueuedTrack(["f2", None, "late"])
    assert _newest(ending, "f1") == ("f2", 1, True)  # type: ignore[arg-type]
    assert _newest(object(), "f1") == ("f1", 0, False)  # type: ignore[arg-type]


def test_both_tracks_share_one_timeline_from_the_first_frame() -> None:
    clock = SessionClock()
    video_offset = clock.offset(5000.0, received=100.0)  # RTP-derived times start anywhere
    audio_offset = clock.offset(12.0, received=100.5)
    assert 5000.0 + video_offset == pytest.approx(0.0)
    assert 12.0 + audio_offset == pytest.approx(0.5)


def test_mdns_candidates_are_removed_and_counted() -> None:
    sdp = "\r\n".join(
        [
            "v=0",
            "m=video 9 UDP/TLS/RTP/SAVPF 96",
            "a=candidate:1 1 udp 2122260223 4b1c-a3e2.local 54400 typ host generation 0",
            "a=candidate:2 1 udp 2122260223 192.0.2.2 54401 typ host generation 0",
        ]
    ) + "\r\n"
    cleaned, removed = without_mdns_candidates(sdp)
    assert removed == 1 and ".local" not in cleaned and "192.0.2.2" in cleaned
    assert without_mdns_candidates(cleaned) == (cleaned, 0)


def test_ice_servers_come_only_from_the_config() -> None:
    assert rtc_configuration([]).iceServers == []  # never aiortc's public STUN default
    turn = IceServerSettings.model_validate({"urls": ["turn:turn.example:3478"], "username": "u", "credential": "pw"})
    (server,) = rtc_configuration([turn]).iceServers or []
    assert server.urls == ["turn:turn.example:3478"] and server.credential == "pw"
