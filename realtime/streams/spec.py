"""A stream's settings turned into what runs: the one place a `StreamSpec` is built.

`vidsentry run` and `vidsentry serve` both describe a stream as settings (the same pydantic
models as the config and the API, so every default is written once) and call `stream_spec`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.graph import ProcessingSpec
from realtime.config import AnyStreamSettings, CameraStreamSettings, SupervisorSettings, TrackerSettings
from realtime.sources.camera import CameraSourceSpec
from realtime.sources.policy import SourcePolicy
from realtime.sources.spec import parse_source
from realtime.sources.supervisor import SupervisorPolicy


@dataclass(frozen=True, slots=True)
class WebRtcSourceSpec:
    """A browser session's media (filled in by the WebRTC edge)."""


@dataclass(frozen=True, slots=True)
class StreamSpec:
    stream_id: str
    source: CameraSourceSpec | WebRtcSourceSpec
    processing: ProcessingSpec

    @property
    def camera(self) -> CameraSourceSpec | None:
        return self.source if isinstance(self.source, CameraSourceSpec) else None


def stream_spec(
    settings: AnyStreamSettings,
    *,
    tracker: TrackerSettings | None = None,
    supervisor: SupervisorSettings | None = None,
    max_failed_connects: int | None = None,
    policy: SupervisorPolicy | None = None,
    trusted: bool = True,
    source_policy: SourcePolicy | None = None,
) -> StreamSpec:
    """What runs for `settings`; raises InvalidSource (a ValueError) when a camera's URL cannot be used.

    A service retries cameras forever (`max_failed_connects=None`); `policy` replaces the
    supervisor settings outright (tests use short timeouts). A stream an API client added is
    not `trusted`: its status events give generic failure reasons (the log has the detail), and its
    source checks `source_policy` before every (re)connect."""
    source: CameraSourceSpec | WebRtcSourceSpec
    if isinstance(settings, CameraStreamSettings):
        if not trusted and source_policy is not None:
            source_policy.check_form(settings.url)  # before parse_source looks at a file: never say it exists
        source = CameraSourceSpec(
            source=parse_source(settings.url),
            ingest=settings.ingest,
            realtime=settings.realtime,
            policy=policy or (supervisor or SupervisorSettings()).to_policy(max_failed_connects),
            untrusted=not trusted,
            admit=None if trusted else source_policy,
        )
    else:
        source = WebRtcSourceSpec()
    processing = ProcessingSpec(
        stream_id=settings.id,
        audio=settings.audio,
        detect_fps=settings.detect_fps,
        tracker=(tracker or TrackerSettings()).to_config(),
        rules=tuple(settings.rules),
        off=settings.stages_off(),
        settings=settings.stage_settings(),
    )
    return StreamSpec(settings.id, source, processing)
