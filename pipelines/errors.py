"""The pipelines layer's exception root; see engines.errors for the scheme."""

from __future__ import annotations

from engines.errors import VidsentryError


class PipelineError(VidsentryError):
    """Base class of every exception the pipelines layer defines."""
