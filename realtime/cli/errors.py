"""The CLI's exit codes and the one error type that becomes one line on stderr."""

from __future__ import annotations

from realtime.errors import ServiceError

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2


class CommandError(ServiceError):
    """A failure to report as one line on stderr, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code
