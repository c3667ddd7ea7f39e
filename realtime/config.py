"""The YAML configuration, validated by pydantic.

Unknown keys and bad values are errors that name the key (`streams.0.url: ...`).
Environment variables with the `VIDSENTRY_` prefix override the file, nested keys joined by
`__` (for example `VIDSENTRY_NATS__URL=nats://bus:4222`, `VIDSENTRY_DETECTOR__CONF=0.4`).
A config with no streams is valid.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from pipelines.frames import StreamId
from pipelines.rules.specs import RuleList
from pipelines.tracker import TrackerConfig
from realtime.sources.policy import SourcePolicy
from realtime.sources.spec import parse_source
from realtime.sources.supervisor import SupervisorPolicy

ENV_PREFIX = "VIDSENTRY_"


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def default_of(cls: type, name: str) -> Any:
    """A dataclass field's default: settings take their defaults from the dataclass they build,
    so each default is written once."""
    for item in dataclasses.fields(cls):
        if item.name == name:
            return item.default
    raise AttributeError(f"{cls.__name__} has no field {name}")


class NatsSettings(_Strict):
    url: str | None = None  # None: start an embedded nats-server
    connect_timeout_s: float = Field(5.0, gt=0)
    stream_max_age_s: float = Field(7 * 24 * 3600, gt=0)
    # Durable events the broker could not take are kept here until it is back (None: no outbox).
    outbox_dir: Path | None = None
    outbox_max_events: int = Field(100_000, ge=1)
    outbox_max_bytes: int = Field(256 * 1024 * 1024, ge=1)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("nats://", "tls://", "ws://", "wss://")):
            raise ValueError("must start with nats://, tls://, ws:// or wss://")
        return value


class DetectorSettings(_Strict):
    model: Path | None = None  # None: the bundled people model
    engine: Literal["auto", "tensorrt", "onnx-cuda", "onnx-cpu"] = "auto"
    conf: float = Field(0.25, gt=0, lt=1)
    iou: float = Field(0.45, gt=0, le=1)
    threads: int | None = Field(None, ge=1)


def _tracker(name: str) -> Any:
    return default_of(TrackerConfig, name)


def _policy(name: str) -> Any:
    return default_of(SupervisorPolicy, name)


class TrackerSettings(_Strict):
    high_score: float = Field(_tracker("high_score"), gt=0, lt=1)
    low_score: float = Field(_tracker("low_score"), ge=0, lt=1)
    new_track_score: float = Field(_tracker("new_track_score"), gt=0, lt=1)
    lost_timeout_s: float = Field(_tracker("lost_timeout_s"), gt=0)
    update_move_fraction: float = Field(_tracker("update_move_fraction"), gt=0)
    max_tracks: int = Field(_tracker("max_tracks"), ge=1)

    def to_config(self) -> TrackerConfig:
        return TrackerConfig(**self.model_dump())


class SupervisorSettings(_Strict):
    backoff_initial_s: float = Field(_policy("backoff_initial"), gt=0)
    backoff_max_s: float = Field(_policy("backoff_max"), gt=0)
    watchdog_s: float = Field(_policy("watchdog_s"), gt=0)
    stall_restart_s: float = Field(_policy("stall_restart_s"), gt=0)
    open_timeout_s: float = Field(_policy("open_timeout_s"), gt=0)
    read_timeout_s: float = Field(_policy("read_timeout_s"), gt=0)

    def to_policy(self, max_failed_connects: int | None = None) -> SupervisorPolicy:
        return SupervisorPolicy(
            backoff_initial=self.backoff_initial_s,
            backoff_max=self.backoff_max_s,
            watchdog_s=self.watchdog_s,
            stall_restart_s=self.stall_restart_s,
            open_timeout_s=self.open_timeout_s,
            read_timeout_s=self.read_timeout_s,
            max_failed_connects=max_failed_connects,
        )


class _StreamBase(_Strict):
    id: StreamId
    audio: bool = True
    detect_fps: float | None = Field(None, gt=0)
    rules: RuleList = []


class CameraStreamSettings(_StreamBase):
    """A camera, file or HTTP stream the service reads (`kind: camera`, the default)."""

    kind: Literal["camera"] = "camera"
    url: str
    ingest: Literal["pyav", "gstreamer"] = "pyav"
    realtime: bool = True  # files in a long-running service behave like cameras

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parse_source(value)  # InvalidSource is a ValueError: pydantic reports it under this key
        return value


class WebRtcStreamSettings(_StreamBase):
    """A browser session's stream (`kind: webrtc`): it has no URL; a session's signalling makes it."""

    kind: Literal["webrtc"]


def _stream_kind(value: Any) -> str:
    kind = value.get("kind", "camera") if isinstance(value, dict) else getattr(value, "kind", "camera")
    return kind if kind in STREAM_KINDS else "camera"  # an unknown kind is reported by the camera model


STREAM_KINDS = ("camera", "webrtc")
StreamSettings = Annotated[
    Annotated[CameraStreamSettings, Tag("camera")] | Annotated[WebRtcStreamSettings, Tag("webrtc")],
    Discriminator(_stream_kind),
]
STREAM_SETTINGS: TypeAdapter[CameraStreamSettings | WebRtcStreamSettings] = TypeAdapter(StreamSettings)
AnyStreamSettings = CameraStreamSettings | WebRtcStreamSettings


class HttpSettings(_Strict):
    """The HTTP API of `vidsentry serve` (flags --host / --port win over these)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)  # 0: any free port (printed at start)
    # Bearer token for /api; VIDSENTRY_API_TOKEN wins over this. SecretStr keeps it out of reprs and logs.
    api_token: SecretStr | None = None
    # Serving a non-loopback address without a token is refused unless this says it is intended.
    allow_unauthenticated: bool = False
    # Streams the service holds at once, from the config and the API together (429 past it). It bounds the
    # service rather than HTTP, but lives here so that no other section changes shape.
    max_streams: int = Field(64, ge=1)
    sse_queue_events: int = Field(256, ge=1)  # per viewer; the oldest go first when a viewer lags
    sse_max_viewers_per_stream: int = Field(16, ge=1)  # /events viewers of one stream (429 past it)
    sse_max_viewers: int = Field(256, ge=1)  # /events viewers of all streams together (429 past it)
    sse_heartbeat_s: float = Field(15.0, gt=0)
    shutdown_timeout_s: float = Field(20.0, gt=0)  # for streams to stop and events to flush

    @field_validator("api_token")
    @classmethod
    def _token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            return None  # an empty token means "no token", as an empty environment variable does
        return value


class SourceSettings(_Strict):
    """What streams added over the HTTP API may open (config-file streams are trusted, never checked)."""

    # Local files only under these directories (regular files, never /proc, /sys or /dev); none: no files.
    local_dirs: list[Path] = []
    # Hosts on loopback, private, link-local or other non-public addresses (off: public hosts only).
    allow_private_hosts: bool = False

    def to_policy(self) -> SourcePolicy:
        dirs = tuple(Path(os.path.realpath(d.expanduser())) for d in self.local_dirs)
        return SourcePolicy(local_dirs=dirs, allow_private_hosts=self.allow_private_hosts)


class Config(_Strict):
    node: str = Field(default_factory=socket.gethostname)
    nats: NatsSettings = NatsSettings()
    http: HttpSettings = HttpSettings()
    detector: DetectorSettings = DetectorSettings()
    tracker: TrackerSettings = TrackerSettings()
    supervisor: SupervisorSettings = SupervisorSettings()
    sources: SourceSettings = SourceSettings()
    streams: list[StreamSettings] = []

    @field_validator("streams")
    @classmethod
    def _camera_streams(cls, streams: list[AnyStreamSettings]) -> list[AnyStreamSettings]:
        for stream in streams:
            if isinstance(stream, WebRtcStreamSettings):
                raise ValueError(f"stream {stream.id!r}: {WEBRTC_NOT_CONFIGURABLE}")
        return streams

    @model_validator(mode="after")
    def _unique_ids(self) -> Config:
        seen: set[str] = set()
        for stream in self.streams:
            if stream.id in seen:
                raise ValueError(f"duplicate stream id {stream.id!r}")
            seen.add(stream.id)
        if len(self.streams) > self.http.max_streams:
            raise ValueError(
                f"{len(self.streams)} streams configured, more than http.max_streams ({self.http.max_streams})"
            )
        return self


WEBRTC_NOT_CONFIGURABLE = "webrtc streams are browser sessions, made by POST /api/webrtc/offer, not configured"


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in {"VIDSENTRY_LOG_LEVEL", "VIDSENTRY_LOG_JSON",
                                                        "VIDSENTRY_API_TOKEN"}:
            continue
        path = name[len(ENV_PREFIX):].lower().split("__")
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = yaml.safe_load(value) if value else value
    return tree


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def validation_problems(error: ValidationError, *, unknown: str = "unknown key") -> list[dict[str, str]]:
    """One `{"field", "message"}` per problem, for the config file and API bodies alike (`unknown`
    names what an unexpected key is: a config has keys, a JSON body fields). A stream's
    kind (the union tag pydantic puts in the location) is left out: `streams.0.url`, not
    `streams.0.camera.url`."""
    problems = []
    for item in error.errors(include_input=False, include_url=False):
        loc = list(item["loc"])
        for i in range(len(loc) - 1, -1, -1):
            after_index = i >= 2 and isinstance(loc[i - 1], int) and loc[i - 2] == "streams"
            if loc[i] in STREAM_KINDS and (i == 0 or after_index):
                del loc[i]
        field = ".".join(str(part) for part in loc) or "(top level)"
        message = unknown if item["type"] == "extra_forbidden" else item["msg"].removeprefix("Value error, ")
        problems.append({"field": field, "message": message})
    return problems


def describe_problems(problems: list[dict[str, str]]) -> str:
    return "; ".join(f"{p['field']}: {p['message']}" for p in problems)


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> Config:
    raw: Any = {}
    where = "environment"
    if path is not None:
        where = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}: not valid YAML{at}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(raw).__name__}")
    raw = _merge(raw, _env_overrides(dict(os.environ if environ is None else environ)))
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {describe_problems(validation_problems(exc))}") from None
