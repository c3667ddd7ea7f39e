"""The body of a WHIP trickle PATCH, read before aiortc sees it: its credentials, its candidates
with their media section, end-of-candidates, and every bound."""

from __future__ import annotations

import pytest

from realtime.webrtc.offer import BadOffer
from realtime.webrtc.trickle import ice_credentials, parse_fragment

FRAGMENT = (
    "a=ice-ufrag:EsAw\r\n"
    "a=ice-pwd:P2uYro0UCOQ4zxjKXaWCBui1\r\n"
    "m=audio 9 RTP/AVP 0\r\n"
    "a=mid:0\r\n"
    "a=candidate:1387637174 1 udp 2122260223 192.0.2.1 61764 typ host generation 0 ufrag EsAw network-id 1\r\n"
    "a=candidate:3471623853 1 udp 2122194687 198.51.100.2 61765 typ host generation 0 ufrag EsAw network-id 2\r\n"
    "a=end-of-candidates\r\n"
)


def test_a_fragment_is_read_whole() -> None:
    fragment = parse_fragment(FRAGMENT, max_bytes=4096, max_candidates=8)
    assert (fragment.ufrag, fragment.pwd, fragment.end) == ("EsAw", "P2uYro0UCOQ4zxjKXaWCBui1", True)
    assert [(c.mid, c.mline_index) for c in fragment.candidates] == [("0", 0), ("0", 0)]
    assert fragment.candidates[1].line.startswith("a=candidate:3471623853 ")


def test_a_fragment_without_credentials_or_sections_is_candidates_only() -> None:
    line = "a=candidate:1 1 udp 1 192.0.2.1 5000 typ host"
    fragment = parse_fragment(line + "\n", max_bytes=4096, max_candidates=8)
    assert (fragment.ufrag, fragment.pwd, fragment.end) == (None, None, False)
    assert [(c.mid, c.mline_index) for c in fragment.candidates] == [(None, 0)]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a=candidate:1 1 udp\r\n", "malformed candidate"),
        ("hello\r\n", "not an SDP fragment line"),
        ("a=candidate:1 1 udp 1 192.0.2.1 5000 typ host\r\n" * 9, "webrtc.max_ice_candidates (8)"),
        ("a=x\r\n" * 2000, "webrtc.max_sdp_bytes"),
    ],
)
def test_bad_fragments_say_why(text: str, reason: str) -> None:
    with pytest.raises(BadOffer, match=reason.replace("(", r"\(").replace(")", r"\)")):
        parse_fragment(text, max_bytes=4096, max_candidates=8)


def test_the_offer_credentials_are_the_first_ones() -> None:
    sdp = "v=0\r\nm=video 9 X 96\r\na=ice-ufrag:one\r\na=ice-pwd:pw1\r\nm=audio 9 X 0\r\na=ice-ufrag:two\r\n"
    assert ice_credentials(sdp) == ("one", "pw1")
    assert ice_credentials("v=0\r\n") == (None, None)
