"""The service layer's exception root (everything under `realtime/`); see engines.errors."""

from __future__ import annotations

from engines.errors import VidsentryError


class ServiceError(VidsentryError):
    """Base class of every exception the service layer defines."""


class LimitReached(ServiceError):
    """A bound on what the service holds was reached (streams, sessions, viewers): `limit` is the
    bound and `setting` its config key, which the API names in its 429 or 503."""

    setting: str = ""

    def __init__(self, message: str, *, limit: int, setting: str | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        if setting is not None:
            self.setting = setting
