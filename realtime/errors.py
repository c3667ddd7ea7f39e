"""The service layer's exception root (everything under `realtime/`); see engines.errors."""

from __future__ import annotations

from engines.errors import VidsentryError


class ServiceError(VidsentryError):
    """Base class of every exception the service layer defines."""
