"""Fixtures of the tests that run the service in-process (HTTP, WebRTC, the service, the CLI):
the small detector and a live service, shared from tests/support/service.py."""

from tests.support.service import detector, svc

__all__ = ["detector", "svc"]
