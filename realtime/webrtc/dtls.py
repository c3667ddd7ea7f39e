"""DTLS for every session: accept a peer whose certificate is RSA, not only ECDSA.

aiortc offers only ECDHE-ECDSA cipher suites. Browsers use ECDSA certificates, so the page never
noticed; but GStreamer's webrtcbin (behind `simple-whip-client` and GStreamer's WHIP sinks)
makes an RSA certificate, takes the DTLS server role when it offers `actpass`, and the handshake
then fails with no suite in common: a WHIP client built on GStreamer could never publish. The
ECDHE-RSA suites added here are the ones browsers also offer; the service's own certificate
stays ECDSA, so nothing changes for a browser.
"""

from __future__ import annotations

from typing import Any

from aiortc import RTCPeerConnection
from aiortc.rtcdtlstransport import RTCCertificate
from OpenSSL import SSL

ECDSA_SUITES = (  # aiortc's own list
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
)
RSA_SUITES = (
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-RSA-CHACHA20-POLY1305",
    "ECDHE-RSA-AES128-SHA",
)
CIPHER_LIST = ":".join(ECDSA_SUITES + RSA_SUITES).encode()


class _Certificate(RTCCertificate):
    def _create_ssl_context(self, srtp_profiles: Any) -> SSL.Context:
        ctx = super()._create_ssl_context(srtp_profiles)
        ctx.set_cipher_list(CIPHER_LIST)
        return ctx


def accept_rsa_peers(pc: RTCPeerConnection) -> None:
    """Call before the peer connection negotiates: its DTLS transports are made with its
    certificates when the remote description is set."""
    certificates: list[RTCCertificate] = pc._RTCPeerConnection__certificates  # type: ignore[attr-defined]
    certificates[:] = [_Certificate(key=c._key, cert=c._cert) for c in certificates]
