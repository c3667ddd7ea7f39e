"""The YAML configuration, validated by pydantic.

Unknown keys and bad values are errors that name the key (`streams.0.url: ...`).
Environment variables with the `VIDSENTRY_` prefix override the file, nested keys joined by
`__` (for example `VIDSENTRY_NATS__URL=nats://bus:4222`, `VIDSENTRY_DETECTOR__CONF=0.4`). A value
is read as the setting's type: a string setting (a token, a host, a path) takes the value as it is,
never parsed; a number or a switch is converted by pydantic (`0.4`, `true`); a list or a section is
YAML. Errors name the variable, never its value. Infinity and NaN are refused everywhere.
A config with no streams is valid.

Every number has a range with a reason: each setting has both bounds (a timeout of 1e308 s, a
count of 4,000 digits or a frame rate of 1e308 is no setting), and the loader refuses what no
setting could hold before pydantic sees it: an integer literal of more than MAX_INT_DIGITS digits
(Python refuses to convert 4,300 and more, and a long one costs quadratic time) and a float
literal that underflows to zero (`for_s: 1e-400` is not 0; one that overflows is infinite,
which every setting refuses).

The file is bounded twice. MAX_CONFIG_BYTES bounds the text; MAX_CONFIG_VALUES bounds what it
expands to: YAML aliases (`*name`) reuse a value by reference, and pydantic validates each use
as a copy, so a 12 KB file that reuses a stream of 64 zone polygons a thousand times costs
gigabytes. So the loader first reads the document's events only (no tags resolved, nothing
built: a tenth of the cost of composing it), counts the values it expands to (each alias use as a
copy, each anchor's size remembered), checks the numbers, and names the innermost key that expands
past the bound; only a document that passes is built. The same pass counts `streams` and reads
`http.max_streams`, so too many streams are refused before any is built or validated (100,000 of
them took 23 s and 600 MB only to be refused). An error message lists at most MAX_PROBLEMS_SHOWN
problems, each cut to MAX_PROBLEM_CHARS on one line.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import stat
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonDict

from pipelines.captions.config import CaptionsSettings
from pipelines.clips.config import ClipsSettings
from pipelines.describe.config import VlmConfig
from pipelines.frames import StreamId
from pipelines.rules.engine import unknown_classes
from pipelines.rules.specs import RuleList
from pipelines.sections import MAX_THREADS, MAX_TIMEOUT_S, Section, default_of
from pipelines.segment.config import SegmentationSettings
from pipelines.tracker import TrackerConfig
from realtime.sources.policy import SourcePolicy
from realtime.sources.spec import parse_source
from realtime.sources.supervisor import SupervisorPolicy
from realtime.timeline.config import TimelineSettings

ENV_PREFIX = "VIDSENTRY_"
# Read by the CLI itself, not settings in the file.
ENV_NOT_SETTINGS = frozenset({"VIDSENTRY_LOG_LEVEL", "VIDSENTRY_LOG_JSON", "VIDSENTRY_API_TOKEN"})
# A config is a few KiB; the cap keeps `--config /dev/zero` or a wrong huge file from eating memory.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# What a config may expand to, YAML aliases counted once per use (mappings, lists and scalars, keys
# included). A real config holds a few hundred; one with 64 streams of 64 rules, each with a
# 64-point zone, about 800,000. Validating this many takes about a second.
MAX_CONFIG_VALUES = 1_000_000
# No setting holds an integer this long (the largest bounds are below 10**13); Python refuses to
# convert 4,300 digits and more, and converting a long one costs quadratic time.
MAX_INT_DIGITS = 18
MAX_PROBLEMS_SHOWN = 20  # in one error message; the rest are counted
MAX_PROBLEM_CHARS = 300  # of one problem's field or message (a key or value may be megabytes)
NATS_SCHEMES = ("nats://", "tls://", "ws://", "wss://")
MAX_FPS = 240.0  # frame rates: the fastest camera or browser frame rate the service takes (webrtc.max_fps)


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the key."""




class NatsSettings(Section):
    url: str | None = None  # None: start an embedded nats-server
    connect_timeout_s: float = Field(5.0, gt=0, le=MAX_TIMEOUT_S)
    stream_max_age_s: float = Field(7 * 24 * 3600, gt=0, le=10 * 366 * 86400)  # ten years
    # Copies JetStream keeps of the VIDSENTRY stream (and of the fleet's KV buckets): 1 on a single
    # server, 3 on a 3-node cluster so losing one node loses nothing. At most the cluster's size.
    replicas: int = Field(1, ge=1, le=5)
    # Durable events the broker could not take are kept here until it is back (None: no outbox).
    outbox_dir: Path | None = None
    outbox_max_events: int = Field(100_000, ge=1, le=100_000_000)
    outbox_max_bytes: int = Field(256 * 1024 * 1024, ge=1, le=1024**4)  # 1 TiB

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_nats_url(value)


def check_nats_url(value: str) -> str:
    """The NATS URL (or comma-separated list) if usable; ValueError saying why not (without the
    URL, which may hold a password). Shared by the config and every command's --nats-url."""
    servers = [part.strip() for part in value.split(",")]
    if not all(servers):
        raise ValueError("an empty server in the list")
    for server in servers:
        if not server.startswith(NATS_SCHEMES):
            raise ValueError("must start with nats://, tls://, ws:// or wss://")
        if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in server):
            raise ValueError("must not contain spaces or control characters")
    return value


class DetectorSettings(Section):
    model: Path | None = None  # None: the bundled people model
    engine: Literal["auto", "tensorrt", "onnx-cuda", "onnx-cpu"] = "auto"
    conf: float = Field(0.25, gt=0, lt=1)
    iou: float = Field(0.45, gt=0, le=1)
    threads: int | None = Field(None, ge=1, le=MAX_THREADS)  # CPU threads in all (default: every core)
    # CPU: model calls side by side, sharing `threads` (default: 2 with 2 or more threads).
    workers: int | None = Field(None, ge=1, le=16)
    # int8: a statically quantized copy run by ONNX Runtime on the CPU (engine onnx-cpu, or auto,
    # which then means the CPU), built once and cached; calibrated on `calibration` frames.
    # auto: int8 for the bundled people model when it runs on the CPU, fp32 otherwise.
    precision: Literal["auto", "fp32", "int8"] = "auto"
    calibration: Path | None = None  # a video of the scenes to calibrate on (default: the sample clip)

    @field_validator("precision")
    @classmethod
    def _precision(cls, value: str, info: ValidationInfo) -> str:
        engine = info.data.get("engine", "auto")
        if value == "int8" and engine not in ("auto", "onnx-cpu"):
            raise ValueError(f"int8 runs on the CPU only for now (engine onnx-cpu or auto), not on {engine}")
        return value


def _tracker(name: str) -> Any:
    return default_of(TrackerConfig, name)


def _policy(name: str) -> Any:
    return default_of(SupervisorPolicy, name)


class TrackerSettings(Section):
    high_score: float = Field(_tracker("high_score"), gt=0, lt=1)
    low_score: float = Field(_tracker("low_score"), ge=0, lt=1)
    new_track_score: float = Field(_tracker("new_track_score"), gt=0, lt=1)
    lost_timeout_s: float = Field(_tracker("lost_timeout_s"), gt=0, le=MAX_TIMEOUT_S)
    update_move_fraction: float = Field(_tracker("update_move_fraction"), gt=0, le=100)
    max_tracks: int = Field(_tracker("max_tracks"), ge=1, le=100_000)

    def to_config(self) -> TrackerConfig:
        return TrackerConfig(**self.model_dump())


class SupervisorSettings(Section):
    backoff_initial_s: float = Field(_policy("backoff_initial"), gt=0, le=MAX_TIMEOUT_S)
    backoff_max_s: float = Field(_policy("backoff_max"), gt=0, le=MAX_TIMEOUT_S)
    watchdog_s: float = Field(_policy("watchdog_s"), gt=0, le=MAX_TIMEOUT_S)
    stall_restart_s: float = Field(_policy("stall_restart_s"), gt=0, le=MAX_TIMEOUT_S)
    open_timeout_s: float = Field(_policy("open_timeout_s"), gt=0, le=MAX_TIMEOUT_S)
    read_timeout_s: float = Field(_policy("read_timeout_s"), gt=0, le=MAX_TIMEOUT_S)

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


# A per-stream stage switch: a bool field of a stream named after the stage it turns off.
_STAGE_SWITCH: JsonDict = {"stage_switch": True}


class _StreamBase(Section):
    id: StreamId
    audio: bool = True
    # live captions of the audio (when `captions.enabled` and audio is on)
    captions: bool = Field(True, json_schema_extra=_STAGE_SWITCH)
    # rolling scene descriptions (when `vlm.endpoints` are set); vlm rules run either way
    describe: bool = Field(True, json_schema_extra=_STAGE_SWITCH)
    # the video around its alerts (when `clips.enabled`)
    clips: bool = Field(True, json_schema_extra=_STAGE_SWITCH)
    detect_fps: float | None = Field(None, gt=0, le=MAX_FPS)
    rules: RuleList = []

    def stages_off(self) -> frozenset[str]:
        """The stages this stream turns off (its stage switches set to false): the graph reads
        these by stage name, so a new switch is one field here and nothing in between."""
        return frozenset(
            name for name, info in type(self).model_fields.items()
            if info.json_schema_extra == _STAGE_SWITCH and getattr(self, name) is False
        )


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


class HttpSettings(Section):
    """The HTTP API of `vidsentry serve` (flags --host / --port win over these)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)  # 0: any free port (printed at start)
    # Bearer token for /api; VIDSENTRY_API_TOKEN wins over this. SecretStr keeps it out of reprs and logs.
    api_token: SecretStr | None = None
    # Serving a non-loopback address without a token is refused unless this says it is intended.
    allow_unauthenticated: bool = False
    # Streams the service holds at once, from the config and the API together (429 past it). It bounds the
    # service rather than HTTP, but lives here so that no other section changes shape.
    max_streams: int = Field(64, ge=1, le=100_000)
    sse_queue_events: int = Field(256, ge=1, le=100_000)  # per viewer; the oldest go first when a viewer lags
    sse_max_viewers_per_stream: int = Field(16, ge=1, le=100_000)  # /events viewers of one stream (429 past it)
    sse_max_viewers: int = Field(256, ge=1, le=100_000)  # /events viewers of all streams together (429 past it)
    # A comment line this often keeps proxies from closing a quiet event stream; faster only floods.
    sse_heartbeat_s: float = Field(15.0, ge=1.0, le=3600.0)
    # A viewer reconnecting with Last-Event-ID gets the durable events it missed from JetStream, at most
    # this far back and this many (the newest); 0 turns resuming off.
    sse_resume_window_s: float = Field(600.0, ge=0, le=86400.0)
    sse_resume_max_events: int = Field(1000, ge=0, le=100_000)
    shutdown_timeout_s: float = Field(20.0, gt=0, le=MAX_TIMEOUT_S)  # for streams to stop and events to flush
    # Host names clients may use besides IP addresses, localhost and the bind host (DNS rebinding: a
    # foreign name is a 421). Unset with a token: any (the token stops a rebinding page). "*": any.
    allowed_hosts: list[str] | None = None
    # Open HTTP connections; at the cap the longest-idle one is closed for a new one, and when none is
    # idle the new one gets a 503. Also kept below half the process's open-file limit.
    max_connections: int = Field(512, ge=1, le=1_000_000)
    # A connection that has not sent a complete request head this long after connecting or after its last
    # response is closed (idle keep-alive and slow headers alike).
    idle_timeout_s: float = Field(30.0, gt=0, le=3600.0)
    # Reading the body and answering one request (event streams excepted: they last); 408 past it.
    request_timeout_s: float = Field(30.0, gt=0, le=3600.0)

    @field_validator("api_token")
    @classmethod
    def _token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            return None  # an empty token means "no token", as an empty environment variable does
        return value


class SourceSettings(Section):
    """What streams added over the HTTP API may open (config-file streams are trusted, never checked)."""

    # Local files only under these directories (regular files, never /proc, /sys or /dev); none: no files.
    local_dirs: list[Path] = []
    # Hosts on private networks (RFC 1918, ULA, carrier-grade NAT), where nearly every camera lives.
    allow_private_hosts: bool = True
    # Hosts on loopback, link-local (cloud metadata included), multicast, unspecified or reserved
    # addresses: this machine and its link, which a client must not reach through the service.
    allow_local_hosts: bool = False

    def to_policy(self) -> SourcePolicy:
        dirs = tuple(Path(os.path.realpath(d.expanduser())) for d in self.local_dirs)
        return SourcePolicy(
            local_dirs=dirs, allow_private_hosts=self.allow_private_hosts, allow_local_hosts=self.allow_local_hosts
        )


ICE_SCHEMES = ("stun:", "stuns:", "turn:", "turns:")


class IceServerSettings(Section):
    """A STUN or TURN server offered to browser sessions (RTCIceServer)."""

    urls: list[str] = Field(min_length=1)
    username: str | None = None
    credential: SecretStr | None = None  # TURN only; kept out of reprs and logs

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(ICE_SCHEMES):
                raise ValueError(f"{url!r} is not an ICE server URL: use {', '.join(ICE_SCHEMES)}")
        return urls


class WebRtcSettings(Section):
    """Browser sessions (`POST /api/webrtc/offer`). Each one is a stream: it counts against
    `http.max_streams` as well as `max_sessions`."""

    # None by default: no STUN/TURN server is contacted (aiortc would otherwise use a public one).
    ice_servers: list[IceServerSettings] = []
    max_sessions: int = Field(4, ge=1, le=10_000)  # concurrent sessions (503 past it)
    # No audio or video from a connected browser for this long ends its session (a closed tab
    # leaves the peer connection up; its media stops).
    inactivity_timeout_s: float = Field(5.0, gt=0, le=3600.0)
    connect_timeout_s: float = Field(15.0, gt=0, le=600.0)  # answer to ICE connected
    # Larger frames are scaled down to fit, faster frames dropped (counted), before any conversion.
    max_width: int = Field(1920, ge=16, le=7680)
    max_height: int = Field(1080, ge=16, le=4320)
    max_fps: float = Field(30.0, gt=0, le=240.0)
    max_sdp_bytes: int = Field(32 * 1024, ge=1024, le=60 * 1024)  # under the 64 KiB body cap of /api
    # Events wait while the DataChannel holds this much unsent; stale detections are dropped meanwhile.
    channel_buffer_bytes: int = Field(256 * 1024, ge=4096, le=64 * 1024 * 1024)
    # Sessions not connected yet (negotiating, or answered and waiting for ICE and DTLS), of all
    # clients and of one client address: an offer that never connects holds its slot for
    # connect_timeout_s, so a few of them must not lock everyone out (503 past either).
    max_connecting: int = Field(2, ge=1, le=10_000)
    max_connecting_per_client: int = Field(1, ge=1, le=10_000)
    # ICE candidates in one offer (400 past it): each is an address the service sends checks to.
    max_ice_candidates: int = Field(64, ge=1, le=1000)
    # Keep candidates on loopback, link-local, multicast and metadata addresses (removed by default:
    # they would make the service send UDP there for a client). For a browser on this machine.
    allow_local_candidates: bool = False


class FleetSettings(Section):
    """Workers sharing streams over NATS JetStream KV (`serve --fleet NAME`); see realtime.fleet.
    `fleet: NAME` is short for `fleet: {name: NAME}`."""

    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,32}$")  # None: no fleet, streams stay local
    capacity: int | None = Field(None, ge=1, le=100_000)  # streams this worker runs at most; None: 2 per CPU core
    lease_ttl_s: float = Field(9.0, ge=1.0, le=300.0)  # a dead worker's streams restart elsewhere within this
    renew_interval_s: float | None = Field(None, gt=0, le=300.0)  # None: a third of lease_ttl_s
    slack: int = Field(0, ge=0, le=100_000)  # streams above the even spread a worker may take before others have theirs
    max_streams: int = Field(1024, ge=1, le=1_000_000)  # desired streams in the whole fleet (429 past it)

    @model_validator(mode="after")
    def _renewals_fit(self) -> FleetSettings:
        if self.renew_interval_s is not None and self.renew_interval_s * 2 > self.lease_ttl_s:
            raise ValueError("renew_interval_s: at most half of lease_ttl_s, so one lost renewal does not lose "
                             "the lease")
        return self

    @property
    def renew_every_s(self) -> float:
        return self.renew_interval_s if self.renew_interval_s is not None else self.lease_ttl_s / 3


class ComputeSettings(Section):
    """One budget for the CPU's cores across the models on it (pipelines.compute): captions first,
    detection with what is left (boxes predicted on the frames it skips), descriptions sample less."""

    scheduler: bool = True  # false: every model uses the cores as it likes (they oversubscribe)
    cores: int | None = Field(None, ge=1, le=1024)  # the budget's thread slots; None: the machine's cores
    # The most of the recent CPU time captions take first while detection waits (the starvation bound).
    captions_max_share: float = Field(0.75, gt=0.0, le=1.0)
    # After a caption decode, a core stays kept for the next one this long (0: none kept; a decode
    # then may wait for a detector call to end, and the detector gets every core between decodes).
    captions_reserve_s: float = Field(0.0, ge=0.0, le=10.0)


class Config(Section):
    node: str = Field(default_factory=socket.gethostname)
    fleet: FleetSettings = FleetSettings()
    nats: NatsSettings = NatsSettings()
    http: HttpSettings = HttpSettings()
    detector: DetectorSettings = DetectorSettings()
    tracker: TrackerSettings = TrackerSettings()
    supervisor: SupervisorSettings = SupervisorSettings()
    sources: SourceSettings = SourceSettings()
    webrtc: WebRtcSettings = WebRtcSettings()
    captions: CaptionsSettings = CaptionsSettings()
    compute: ComputeSettings = ComputeSettings()
    vlm: VlmConfig = VlmConfig()
    segmentation: SegmentationSettings = SegmentationSettings()
    clips: ClipsSettings = ClipsSettings()
    timeline: TimelineSettings = TimelineSettings()
    streams: list[StreamSettings] = []

    @field_validator("streams", mode="before")
    @classmethod
    def _stream_count(cls, value: Any, info: ValidationInfo) -> Any:
        # Before any stream is validated: 100,000 streams took 23 s and 600 MB only to be refused.
        if isinstance(value, list):
            http = info.data.get("http")
            limit = http.max_streams if isinstance(http, HttpSettings) else HttpSettings().max_streams
            if len(value) > limit:
                raise ValueError(f"{len(value)} streams configured, more than http.max_streams ({limit})")
        return value

    @field_validator("fleet", mode="before")
    @classmethod
    def _fleet_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

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


def _members(annotation: Any) -> list[Any]:
    """The types a field accepts: Annotated metadata and None dropped, unions flattened."""
    if typing.get_origin(annotation) is Annotated:
        return _members(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    return [] if annotation is type(None) else [annotation]


def _is_model(member: Any) -> bool:
    return isinstance(member, type) and issubclass(member, BaseModel)


def _is_text(member: Any) -> bool:
    if typing.get_origin(member) is Literal:
        return all(isinstance(v, str) for v in typing.get_args(member))
    return isinstance(member, type) and issubclass(member, str | SecretStr | os.PathLike)


def _env_kind(path: list[str]) -> str:
    """How an environment value for the setting at `path` is read: "text" (as it is), "scalar"
    (a string pydantic converts: numbers, switches), or "yaml" (lists and whole sections)."""
    members: list[Any] = [Config]
    for part in path:
        models = [m for m in members if _is_model(m)]
        field = next((m.model_fields[part] for m in models if part in m.model_fields), None)
        if field is None:
            return "text"  # no such key: pydantic reports it as unknown, naming it
        members = _members(field.annotation)
    if any(_is_model(m) or typing.get_origin(m) in (list, tuple, dict, set) for m in members):
        return "yaml"
    return "text" if members and all(_is_text(m) for m in members) else "scalar"


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the environment sets, as a tree to merge over the file, and which variable set
    each (by dotted key, for error messages)."""
    tree: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_SETTINGS:
            continue
        path = name[len(ENV_PREFIX):].lower().split("__")
        if _env_kind(path) == "yaml":
            try:
                parsed, _shape = parse_yaml(value)
            except YamlProblem as exc:
                raise ConfigError(f"environment: {name}: {exc}") from None  # names a key, never a value
            except (yaml.YAMLError, ValueError, TypeError, RecursionError):
                raise ConfigError(f"environment: {name}: not valid YAML") from None  # the value may be secret
        else:
            parsed = value  # never YAML: `null`, `~`, `abc #x`, `!tok` or `::` are what they say
        node = tree
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment: {name}: {'.'.join(path[:-1])} is set by another variable too")
            node = child
        node[path[-1]] = parsed
        sources[".".join(path)] = name
    return tree, sources


def _name_variables(problems: list[dict[str, str]], sources: Mapping[str, str]) -> list[dict[str, str]]:
    """`http.port` becomes `http.port (VIDSENTRY_HTTP__PORT)` when the environment set it."""
    named = []
    for problem in problems:
        field = problem["field"]
        variable = next((v for key, v in sources.items() if field == key or field.startswith(key + ".")), None)
        named.append({**problem, "field": f"{field} ({variable})"} if variable else problem)
    return named


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


def _clip(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    text = " ".join(text.split())  # one line
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_problems(problems: list[dict[str, str]]) -> str:
    """One line: the first MAX_PROBLEMS_SHOWN problems, each cut to MAX_PROBLEM_CHARS, and how
    many more there are."""
    shown = "; ".join(f"{_clip(p['field'])}: {_clip(p['message'])}" for p in problems[:MAX_PROBLEMS_SHOWN])
    more = len(problems) - MAX_PROBLEMS_SHOWN
    return shown + (f"; and {more} more problem{'s' if more > 1 else ''}" if more > 0 else "")


def first_problems(problems: list[dict[str, str]]) -> list[dict[str, str]]:
    """At most MAX_PROBLEMS_SHOWN problems, each cut to MAX_PROBLEM_CHARS (for an API body's detail)."""
    return [{"field": _clip(p["field"]), "message": _clip(p["message"])} for p in problems[:MAX_PROBLEMS_SHOWN]]


# -- reading YAML: numbers and expansion checked before anything is built -------------------------

# libyaml when PyYAML has it: ten times faster on a large file, and it bounds nesting (1,000 levels).
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# A plain scalar that reads as a decimal number, to YAML (`1.5`, `12`) or to pydantic (`1e-400`).
_PLAIN_NUMBER = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?\Z")


class YamlProblem(ValueError):
    """A YAML document that cannot be a config, found before it is built; names the key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key or '(top level)'}: {message}")


def integer_problem(text: str) -> str | None:
    """Why an integer literal is out of range for every setting, or None."""
    digits = sum(ch.isalnum() for ch in text)
    if digits > MAX_INT_DIGITS:
        return f"an integer of {digits} digits is out of range (at most {MAX_INT_DIGITS} digits)"
    return None


def float_problem(text: str, value: float) -> str | None:
    """Why a float literal cannot be read as the number it says (it underflows to 0), or None.
    One that overflows is infinite, which every setting refuses by name (allow_inf_nan)."""
    mantissa = text.lower().split("e")[0]
    if value == 0.0 and any(ch in "123456789" for ch in mantissa):
        return f"{_clip(text, 40)} is too small for a number (it would be read as 0)"
    return None


_HEX_OCT_BIN = re.compile(r"[-+]?0(?:x[0-9a-fA-F_]+|b[01_]+|[0-7_]+)\Z")


@dataclasses.dataclass(slots=True)
class _Open:
    """A mapping or list being read: its key, what it holds so far, and where the next value goes."""

    key: str
    anchor: str | None
    mapping: bool
    values: int = 0  # expanded, its own values and everything under them
    items: int = 0  # direct items (a mapping counts keys and values)
    label: str = "?"  # a mapping's last key, naming the value that follows it

    def child_key(self) -> str:
        # In a mapping a value is named by its key; a key itself (an even item) is "?".
        name = str(self.items) if not self.mapping else self.label if self.items % 2 else "?"
        return f"{self.key}.{name}" if self.key else name


@dataclasses.dataclass(slots=True)
class YamlShape:
    """What check_yaml_events found: the values the document expands to, and the raw
    `streams` length and `http.max_streams` text, to refuse too many streams before any is built."""

    values: int
    streams: int | None
    max_streams: str | None


def check_yaml_events(text: str, max_values: int = MAX_CONFIG_VALUES) -> YamlShape:
    """Reads the document's events (no tags resolved, no nodes or values built: the cheap part of
    YAML, a tenth of the composing) and counts the values it expands to, each use of an alias as a
    copy. YamlProblem names the smallest key that expands past `max_values`, an alias that
    contains itself, or a number no setting can hold; yaml.YAMLError a document that is no YAML."""
    loader = _YAML_LOADER(text)
    stack: list[_Open] = []
    anchors: dict[str, int] = {}
    open_anchors: set[str] = set()
    shape = YamlShape(values=0, streams=None, max_streams=None)
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.ScalarEvent | yaml.AliasEvent):
                key = stack[-1].child_key() if stack else ""
                if isinstance(event, yaml.AliasEvent):
                    if event.anchor in open_anchors:
                        raise YamlProblem(key, "a YAML alias refers to a value that contains it")
                    size = anchors.get(event.anchor or "", 1)  # an unknown anchor: the composer says so
                else:
                    _check_scalar(event, key)
                    if key == "http.max_streams":
                        shape.max_streams = event.value
                    size = 1
                    if stack and stack[-1].mapping and stack[-1].items % 2 == 0:
                        stack[-1].label = _clip(event.value, 64)
                if event.anchor is not None and isinstance(event, yaml.ScalarEvent):
                    anchors[event.anchor] = 1
                _add(stack, size, max_values, shape)
            elif isinstance(event, yaml.CollectionStartEvent):
                key = stack[-1].child_key() if stack else ""
                stack.append(_Open(key, event.anchor, isinstance(event, yaml.MappingStartEvent)))
                if event.anchor is not None:
                    open_anchors.add(event.anchor)
            elif isinstance(event, yaml.CollectionEndEvent):
                done = stack.pop()
                if done.key == "streams" and not done.mapping:
                    shape.streams = done.items
                if done.anchor is not None:
                    open_anchors.discard(done.anchor)
                    anchors[done.anchor] = 1 + done.values
                _add(stack, 1 + done.values, max_values, shape)
    finally:
        loader.dispose()
    return shape


def _add(stack: list[_Open], size: int, max_values: int, shape: YamlShape) -> None:
    if not stack:
        shape.values = size
        return
    parent = stack[-1]
    parent.values += size
    parent.items += 1
    if parent.values >= max_values:  # +1 for the parent itself: past the bound, named where it happens
        raise YamlProblem(
            parent.key,
            f"expands to more than {max_values:,} values (each use of a YAML alias counts as a copy); "
            "a config holds far fewer",
        )


def _check_scalar(event: yaml.ScalarEvent, key: str) -> None:
    value, tag = event.value, event.tag
    plain = event.implicit[0] and not event.style  # no tag, no quotes: YAML or pydantic reads a number
    problem = None
    if tag == _INT_TAG or (plain and _HEX_OCT_BIN.match(value)):
        problem = integer_problem(value)
    elif tag == _FLOAT_TAG or (plain and _PLAIN_NUMBER.match(value)):
        try:
            number = float(value.replace("_", ""))
        except ValueError:
            return  # `.inf`, `1:30.5`: pydantic judges those
        problem = float_problem(value, number)
        if problem is None and not any(ch in value for ch in ".eE"):
            problem = integer_problem(value)
    if problem is not None:
        raise YamlProblem(key, problem)


def parse_yaml(text: str, check: Callable[[YamlShape], None] | None = None) -> tuple[Any, YamlShape]:
    """The document's value and shape, built only after check_yaml_events (and `check`, given the
    shape) passed; YamlProblem or yaml.YAMLError (with a mark) when it cannot be a config."""
    shape = check_yaml_events(text)
    if check is not None:
        check(shape)
    loader = _YAML_LOADER(text)
    try:
        return loader.get_single_data(), shape
    finally:
        loader.dispose()


def read_config_text(path: str | Path) -> str:
    """The file's text: a regular file of at most MAX_CONFIG_BYTES in UTF-8, else ConfigError."""
    try:
        # Non-blocking, so that a FIFO is refused below instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{path}: not a regular file")
    with open(fd, "rb") as file:
        try:
            data = file.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB, too large for a config")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    raw: Any = {}
    where = "environment"
    environ = os.environ if environ is None else environ
    if path is not None:
        where = str(path)
        text = read_config_text(path)
        try:
            raw, _shape = parse_yaml(text, check=lambda shape: _check_stream_count(where, shape, environ))
            raw = raw or {}
        except ConfigError:
            raise
        except YamlProblem as exc:
            raise ConfigError(f"{path}: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}: not valid YAML{at}") from None
        except (ValueError, TypeError, RecursionError):  # what PyYAML's constructors let through
            raise ConfigError(f"{path}: not valid YAML") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys, not {type(raw).__name__}")
    overrides, sources = _env_overrides(environ)
    raw = _merge(raw, overrides)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        problems = _name_variables(validation_problems(exc), sources)
        raise ConfigError(f"{where}: {describe_problems(problems)}") from None


def _check_stream_count(path: str | Path, shape: YamlShape, environ: Mapping[str, str]) -> None:
    """Too many streams, refused from the document's shape alone: before anything is validated.
    The limit is http.max_streams as the environment or the file says it; a value that is no
    number leaves the check to pydantic unless the count is past any value the setting may take."""
    if shape.streams is None or f"{ENV_PREFIX}STREAMS" in environ:  # the environment's list replaces the file's
        return
    given = environ.get(f"{ENV_PREFIX}HTTP__MAX_STREAMS", shape.max_streams)
    field = HttpSettings.model_fields["max_streams"]
    ceiling = next(m.le for m in field.metadata if getattr(m, "le", None) is not None)
    text = (given or "").strip().replace("_", "")
    limit = int(text) if given is not None and text.isdigit() and len(text) <= MAX_INT_DIGITS else None
    if limit is None or not 1 <= limit <= ceiling:
        limit = field.default if given is None else ceiling
    if shape.streams > limit:
        raise ConfigError(f"{path}: streams: {shape.streams} streams configured, more than http.max_streams ({limit})")


def rule_class_problems(stream: AnyStreamSettings, names: Mapping[int, str]) -> list[dict[str, str]]:
    """One `{"field", "message"}` per rule of the stream that names a class the detector does
    not have (`rules.1.classes: rule 'door': class 'person' not among ...`); none when the
    model's class names are unknown."""
    if not names:
        return []
    problems = []
    for index, rule in enumerate(stream.rules):
        for message in unknown_classes([rule], names):
            key = "fall_class" if rule.type == "fall" else "classes"
            problems.append({"field": f"rules.{index}.{key}", "message": message})
    return problems


def config_class_problems(config: Config, names: Mapping[int, str]) -> str | None:
    """The config's rules checked against the detector's classes: None, or one line naming each
    rule that cannot run (`streams.0.rules.1.classes: ...`)."""
    problems = [
        {**problem, "field": f"streams.{index}.{problem['field']}"}
        for index, stream in enumerate(config.streams)
        for problem in rule_class_problems(stream, names)
    ]
    return describe_problems(problems) if problems else None


VLM_RULE_NEEDS_VLM = "a vlm rule needs a VLM: set vlm.endpoints (or --vlm-url)"


def vlm_rule_problems(stream: AnyStreamSettings, vlm_enabled: bool) -> list[dict[str, str]]:
    """One `{"field", "message"}` per `vlm` rule of the stream when there is no VLM to ask: such a
    rule could never fire."""
    if vlm_enabled:
        return []
    return [
        {"field": f"rules.{index}.type", "message": f"rule {rule.id!r}: {VLM_RULE_NEEDS_VLM}"}
        for index, rule in enumerate(stream.rules)
        if rule.type == "vlm"
    ]


def config_vlm_problems(config: Config, vlm_enabled: bool) -> str | None:
    """The config's `vlm` rules checked against whether a VLM is configured: None, or one line."""
    problems = [
        {**problem, "field": f"streams.{index}.{problem['field']}"}
        for index, stream in enumerate(config.streams)
        for problem in vlm_rule_problems(stream, vlm_enabled)
    ]
    return describe_problems(problems) if problems else None
