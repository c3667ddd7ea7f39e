"""The YAML configuration, validated by pydantic: every section's model, the whole `Config`, and
`load_config`.

A capability's section, its per-stream switch and its rule types come from its package, through
the registry (pipelines.capabilities): `Config` is the service's own sections plus one per
capability, a stream's settings have one switch per capability that declares one, and a stream's
`rules` are the union of the core rule types and every capability's (`config_model` builds them
all from the capabilities it is given). Code outside a capability
reads its section by name (`config.section("captions")`), so this module names none of them.

Unknown keys and bad values are errors that name the key (`streams.0.url: ...`). Infinity and NaN
are refused everywhere. A config with no streams is valid. Every number has a range with a reason:
each setting has both bounds (a timeout of 1e308 s, a count of 4,000 digits or a frame rate of
1e308 is no setting). How the file is read without letting it cost more than a config should is
realtime.config_yaml; how the environment overrides it, realtime.config_env; how its rules are
checked against the model and the capabilities that answer them, realtime.config_checks. An error
message lists at most MAX_PROBLEMS_SHOWN problems, each cut to MAX_PROBLEM_CHARS on one line.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    Discriminator,
    Field,
    SecretStr,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonDict

from pipelines.capabilities import CAPABILITIES
from pipelines.capability import Capability
from pipelines.frames import StreamId
from pipelines.rules.specs import CORE_RULES, RuleList, rule_list
from pipelines.sections import MAX_THREADS, MAX_TIMEOUT_S, Section, default_of
from pipelines.tracker import TrackerConfig
from realtime.config_env import ENV_PREFIX, env_overrides, merge, name_variables
from realtime.config_yaml import (
    MAX_INT_DIGITS,
    ConfigError,
    YamlProblem,
    YamlShape,
    clip,
    parse_yaml,
    read_config_text,
)
from realtime.sources.policy import SourcePolicy
from realtime.sources.spec import parse_source
from realtime.sources.supervisor import SupervisorPolicy

MAX_PROBLEMS_SHOWN = 20  # in one error message; the rest are counted
NATS_SCHEMES = ("nats://", "tls://", "ws://", "wss://")
MAX_FPS = 240.0  # frame rates: the fastest camera or browser frame rate the service takes (webrtc.max_fps)




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
    # MQTT 3.1.1 (Home Assistant and other MQTT clients; docs/mqtt.md). The embedded server listens
    # on mqtt_host:mqtt_port when a port is set (None: no MQTT); with an external server (`url`) these
    # say where its own MQTT listener is and how to log in to it: the host is then `url`'s.
    mqtt_port: int | None = Field(None, ge=1, le=65535)
    mqtt_host: str = "127.0.0.1"  # the embedded listener's address; a non-loopback one needs a password
    mqtt_username: str | None = Field(None, min_length=1, max_length=256)
    mqtt_password: SecretStr | None = None  # kept out of reprs and logs

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_nats_url(value)

    @model_validator(mode="after")
    def _mqtt_login(self) -> NatsSettings:
        if (self.mqtt_username is None) != (self.mqtt_password is None):
            raise ValueError("mqtt_username and mqtt_password: set both or neither")
        if self.mqtt_port is not None and self.url is None and self.mqtt_password is None \
                and not _loopback(self.mqtt_host):
            raise ValueError(f"mqtt_host {self.mqtt_host}: an MQTT listener off loopback needs mqtt_username and "
                             "mqtt_password (anyone reaching it could read every event and publish)")
        return self


def _loopback(host: str) -> bool:
    if host.rstrip(".").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name may resolve anywhere


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


class _StreamCore(Section):
    id: StreamId
    audio: bool = True
    detect_fps: float | None = Field(None, gt=0, le=MAX_FPS)
    rules: RuleList = []

    def stages_off(self) -> frozenset[str]:
        """The stages this stream turns off (its stage switches set to false): the graph reads
        these by stage name, so a new switch is one field here and nothing in between."""
        return frozenset(
            name for name, info in type(self).model_fields.items()
            if info.json_schema_extra == _STAGE_SWITCH and getattr(self, name) is False
        )

    def stage_settings(self) -> dict[str, Section]:
        """The stages this stream gives settings of its own (a switch holding a mapping, not true),
        by stage name: the graph hands each to its stage, which lets them win over its section."""
        return {
            name: value for name, info in type(self).model_fields.items()
            if info.json_schema_extra == _STAGE_SWITCH and isinstance(value := getattr(self, name), Section)
        }


# The two forms of a switch with settings, as the union tags them; validation_problems leaves the
# tag out of an error's key (`streams.0.captions.language`, not `...captions.own.language`).
_SWITCH_TAGS = ("switch", "own")


def _switch_form(value: Any) -> str:
    return "own" if isinstance(value, Mapping | Section) else "switch"


def _switches(capabilities: Iterable[Capability[Any, Any]]) -> dict[str, Any]:
    """Each capability's switch: a bool, or (where it declares the stream's own settings) a bool or
    a mapping of them."""
    def kind(settings: type[Section] | None) -> Any:
        if settings is None:
            return bool
        union = Annotated[bool, Tag("switch")] | Annotated[settings, Tag("own")]  # type: ignore[valid-type]
        return Annotated[union, Discriminator(_switch_form)]

    return {
        c.switch.name: (
            kind(c.switch.settings), Field(True, description=c.switch.help, json_schema_extra=_STAGE_SWITCH)
        )
        for c in capabilities if c.switch is not None
    }


def _rules(capabilities: Iterable[Capability[Any, Any]]) -> Any:
    """A stream's rule list: the core types and each capability's."""
    return rule_list((*CORE_RULES, *(rule for c in capabilities for rule in c.rules)))


if TYPE_CHECKING:  # the switches are read by stage name (stages_off), never as attributes
    class _StreamBase(_StreamCore):
        pass
else:
    _StreamBase = create_model(
        "_StreamBase",
        __base__=_StreamCore,
        __module__=__name__,
        rules=(_rules(CAPABILITIES), []),
        **_switches(CAPABILITIES),
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
AnyStreamSettings = CameraStreamSettings | WebRtcStreamSettings
_BUILT_WITH = tuple(CAPABILITIES)  # the capabilities the models above have


class _StreamSettingsAdapter:
    """One stream's settings as the registry stands when asked (the API's and the fleet's streams):
    the models above, or those `stream_settings` builds while a capability is installed."""

    def __init__(self) -> None:
        self._built: tuple[tuple[Capability[Any, Any], ...], TypeAdapter[AnyStreamSettings]] | None = None

    def _adapter(self) -> TypeAdapter[AnyStreamSettings]:
        capabilities = tuple(CAPABILITIES)
        if self._built is None or self._built[0] != capabilities:
            self._built = (capabilities, TypeAdapter(stream_settings(capabilities)))
        return self._built[1]

    def validate_python(self, value: Any, *, strict: bool | None = None) -> AnyStreamSettings:
        return self._adapter().validate_python(value, strict=strict)

    def validate_json(self, value: str | bytes, *, strict: bool | None = None) -> AnyStreamSettings:
        return self._adapter().validate_json(value, strict=strict)


STREAM_SETTINGS = _StreamSettingsAdapter()


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
    # Live viewers (`POST /whep/{stream}`), of all streams together (503 past it): each one is a
    # peer connection the camera's packets are copied to.
    max_viewers: int = Field(8, ge=1, le=10_000)
    # Packets queued for one viewer; a viewer this far behind skips to the next keyframe (counted),
    # and one that falls behind `max_viewer_skips` times in a row is dropped.
    viewer_queue_packets: int = Field(90, ge=8, le=10_000)
    max_viewer_skips: int = Field(3, ge=1, le=1000)
    # Streams whose packets are not forwarded (not H.264, or decoded frames only: browser and WHIP
    # sessions, GStreamer ingest) have their frames encoded to H.264 for viewers, one encoder per
    # stream while it is watched, in the compute budget; false refuses them (409) instead.
    live_encode: bool = True
    # Frames wider than this are scaled down (aspect kept) before they are encoded for viewers.
    live_max_width: int = Field(1280, ge=16, le=7680)


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


class TimelineSettings(Section):
    """Captions, descriptions, alerts, track summaries and clips, searchable (GET /api/search); see
    realtime.timeline."""

    enabled: bool = True
    # One SQLite file. None: a temporary one for this run, filled from JetStream at start (the
    # embedded NATS keeps its events for the run only, so that is all there is to index).
    path: Path | None = None
    max_entries: int = Field(5_000_000, ge=1000, le=1_000_000_000)  # the oldest go first
    max_age_s: float = Field(30 * 86400.0, gt=0, le=10 * 366 * 86400.0)  # older entries are deleted
    batch: int = Field(256, ge=1, le=10_000)  # events read and committed at once


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


class HomeAssistantSettings(Section):
    """Home Assistant over MQTT (docs/mqtt.md): discovery configs and retained states, published
    through the NATS server's MQTT listener (`nats.mqtt_port`), which must be set."""

    enabled: bool = False
    discovery_prefix: str = Field("homeassistant", pattern=r"^[A-Za-z0-9_-]{1,64}$")  # HA's own setting
    # Where the states go: kept apart from `vidsentry/`, so the event subscribers never see them.
    state_prefix: str = Field("vidsentry-ha", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # A sensor per class counting its tracked objects; None: the classes the stream's rules name,
    # or when they name none every class of a model with at most 8 (the bundled one: Normal, Fall).
    count_classes: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(None, max_length=64)
    snapshot: bool = True  # the latest alert snapshot as an image entity (JPEG, retained)


class _ServiceConfig(Section):
    """The service's own sections; `Config` adds the capabilities'."""

    node: str = Field(default_factory=socket.gethostname)
    fleet: FleetSettings = FleetSettings()
    nats: NatsSettings = NatsSettings()
    http: HttpSettings = HttpSettings()
    detector: DetectorSettings = DetectorSettings()
    tracker: TrackerSettings = TrackerSettings()
    supervisor: SupervisorSettings = SupervisorSettings()
    sources: SourceSettings = SourceSettings()
    webrtc: WebRtcSettings = WebRtcSettings()
    compute: ComputeSettings = ComputeSettings()
    timeline: TimelineSettings = TimelineSettings()
    homeassistant: HomeAssistantSettings = HomeAssistantSettings()
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
    def _home_assistant_has_mqtt(self) -> _ServiceConfig:
        if self.homeassistant.enabled and self.nats.mqtt_port is None:
            raise ValueError("homeassistant.enabled needs nats.mqtt_port: Home Assistant speaks MQTT")
        return self

    @model_validator(mode="after")
    def _unique_ids(self) -> _ServiceConfig:
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

    def section(self, name: str) -> Any:
        """A section by its key: how code outside a capability reads the capability's own."""
        if name not in type(self).model_fields:
            raise KeyError(f"no config section {name!r}")
        return getattr(self, name)


def stream_settings(capabilities: Iterable[Capability[Any, Any]]) -> Any:
    """The type of one stream's settings with these capabilities' switches and rule types: the
    module's own models where those are what they were built with, else subclasses of them."""
    capabilities = tuple(capabilities)
    switches = {k: v for k, v in _switches(capabilities).items() if k not in CameraStreamSettings.model_fields}
    if not switches and set(capabilities) <= set(_BUILT_WITH):
        return StreamSettings
    rules: tuple[Any, list[Any]] = (_rules(capabilities), [])
    camera = create_model("CameraStreamSettings", __base__=CameraStreamSettings, __module__=__name__,
                          rules=rules, **switches)
    webrtc = create_model("WebRtcStreamSettings", __base__=WebRtcStreamSettings, __module__=__name__,
                          rules=rules, **switches)
    return Annotated[Annotated[camera, Tag("camera")] | Annotated[webrtc, Tag("webrtc")], Discriminator(_stream_kind)]


def config_model(capabilities: Iterable[Capability[Any, Any]]) -> type[_ServiceConfig]:
    """The whole configuration's model: the service's sections and each capability's, by its key,
    and streams with each capability's switch and rule types."""
    capabilities = tuple(capabilities)
    sections: dict[str, Any] = {c.section: (c.settings, c.settings()) for c in capabilities}
    return create_model(
        "Config",
        __base__=_ServiceConfig,
        __module__=__name__,
        __doc__="The whole configuration: the service's sections and each capability's (by its section key).",
        streams=(list[stream_settings(capabilities)], []),  # type: ignore[arg-type, misc]
        **sections,
    )


if TYPE_CHECKING:
    Config = _ServiceConfig
else:
    Config = config_model(CAPABILITIES)


WEBRTC_NOT_CONFIGURABLE = "webrtc streams are browser sessions, made by POST /api/webrtc/offer, not configured"


def validation_problems(error: ValidationError, *, unknown: str = "unknown key") -> list[dict[str, str]]:
    """One `{"field", "message"}` per problem, for the config file and API bodies alike (`unknown`
    names what an unexpected key is: a config has keys, a JSON body fields). A stream's
    kind (the union tag pydantic puts in the location) is left out: `streams.0.url`, not
    `streams.0.camera.url`."""
    problems = []
    switches = {c.switch.name for c in CAPABILITIES if c.switch is not None}
    for item in error.errors(include_input=False, include_url=False):
        loc = list(item["loc"])
        for i in range(len(loc) - 1, -1, -1):
            after_index = i >= 2 and isinstance(loc[i - 1], int) and loc[i - 2] == "streams"
            kind_tag = loc[i] in STREAM_KINDS and (i == 0 or after_index)
            switch_tag = loc[i] in _SWITCH_TAGS and i >= 1 and loc[i - 1] in switches
            if kind_tag or switch_tag:
                del loc[i]
        field = ".".join(str(part) for part in loc) or "(top level)"
        message = unknown if item["type"] == "extra_forbidden" else item["msg"].removeprefix("Value error, ")
        problems.append({"field": field, "message": message})
    return problems


def describe_problems(problems: list[dict[str, str]]) -> str:
    """One line: the first MAX_PROBLEMS_SHOWN problems, each cut to MAX_PROBLEM_CHARS, and how
    many more there are."""
    shown = "; ".join(f"{clip(p['field'])}: {clip(p['message'])}" for p in problems[:MAX_PROBLEMS_SHOWN])
    more = len(problems) - MAX_PROBLEMS_SHOWN
    return shown + (f"; and {more} more problem{'s' if more > 1 else ''}" if more > 0 else "")


def first_problems(problems: list[dict[str, str]]) -> list[dict[str, str]]:
    """At most MAX_PROBLEMS_SHOWN problems, each cut to MAX_PROBLEM_CHARS (for an API body's detail)."""
    return [{"field": clip(p["field"]), "message": clip(p["message"])} for p in problems[:MAX_PROBLEMS_SHOWN]]


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
    overrides, sources = env_overrides(Config, environ)
    raw = merge(raw, overrides)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        problems = name_variables(validation_problems(exc), sources)
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
