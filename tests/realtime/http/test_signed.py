"""Signed links (realtime/http/signed.py): a link opens exactly its path until it expires."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from realtime.http.signed import UrlSigner

PATH = "/api/clips/" + "a" * 32 + ".mp4"


def query(link: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(link).query))


def test_a_signed_link_opens_its_path_until_it_expires_and_nothing_else() -> None:
    signer = UrlSigner(b"k" * 32, ttl_s=60)
    link = signer.sign(PATH, now=1000.0)
    assert link.startswith(PATH + "?exp=1060&sig=")
    signed = query(link)
    assert signer.valid(PATH, signed, now=1000.0) and signer.valid(PATH, signed, now=1060.0)
    assert not signer.valid(PATH, signed, now=1060.5)  # expired
    assert not signer.valid(PATH.replace(".mp4", ".vtt"), signed, now=1000.0)  # another path
    assert not signer.valid(PATH, {**signed, "exp": "1061"}, now=1000.0)  # a longer life, unsigned
    assert not signer.valid(PATH, {**signed, "exp": "99999999"}, now=1000.0)  # beyond any ttl
    assert not signer.valid(PATH, {**signed, "sig": signed["sig"][:-1] + "A"}, now=1000.0)
    assert not UrlSigner(b"x" * 32, ttl_s=60).valid(PATH, signed, now=1000.0)  # another process's key
    for hostile in ({}, {"exp": "", "sig": ""}, {"exp": "-5", "sig": "x"}, {"exp": "1e9", "sig": "x"},
                    {"exp": "1" * 40, "sig": "x"}, {"exp": "1050", "sig": "\udcff"}):
        assert not signer.valid(PATH, hostile, now=1000.0), hostile
