"""Config loading: valid files, env overrides, and errors that name the key."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from realtime.config import AnyStreamSettings, Config, ConfigError, load_config
from realtime.config_yaml import MAX_CONFIG_BYTES

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vidsentry.yaml"
    path.write_text(text)
    return path


def test_sample_config_loads(sample_clip: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    config = load_config(ROOT / "samples" / "vidsentry.yaml", environ={})
    assert [s.id for s in config.streams] == ["plaza"]
    assert config.nats.url is None and config.detector.engine == "auto"


def settings(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every setting of a config model as a dotted key; a section is its settings, not a key (a
    stream's switch that may hold its capability's own settings is its key and theirs)."""
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from settings(info.annotation, f"{prefix}{name}.")
        else:
            yield prefix + name
            switch = info.json_schema_extra == {"stage_switch": True}
            for own in _models_in(info.annotation) if switch else ():
                yield from settings(own, f"{prefix}{name}.")


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The config models inside a union (Annotated and tagged, as a switch with settings is)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in get_args(annotation):
        yield from _models_in(arg)


def keys(data: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for name, value in data.items():
        yield prefix + name
        if isinstance(value, Mapping):
            yield from keys(value, f"{prefix}{name}.")


def test_the_sample_config_names_every_setting() -> None:
    # The model as built (with each capability's section and stream switch): a setting added
    # anywhere must show up in the sample, which is where users look for it.
    sample = yaml.safe_load((ROOT / "samples" / "vidsentry.yaml").read_text())
    named = set(keys({k: v for k, v in sample.items() if k != "streams"}))
    named |= {f"streams.{key}" for stream in sample["streams"] for key in keys(stream)}
    wanted = [key for key in settings(Config) if key != "streams"]
    for stream_model in get_args(AnyStreamSettings):  # camera and webrtc
        wanted += [key for key in settings(stream_model, "streams.") if key not in wanted]
    assert [key for key in wanted if key not in named] == []


def test_empty_config_is_valid(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), environ={})
    assert config.streams == []


def test_caption_settings_reach_the_stage(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "captions:\n  max_window_s: 12\n  step_s: 0.4\n"), environ={})
    settings = config.captions.to_policy()
    assert settings.max_window_s == 12.0 and settings.step_s == 0.4


def test_env_overrides_nested_keys(tmp_path: Path) -> None:
    path = write(tmp_path, "detector:\n  conf: 0.3\n")
    config = load_config(path, environ={"VIDSENTRY_DETECTOR__CONF": "0.5", "VIDSENTRY_NATS__URL": "nats://bus:4222"})
    assert config.detector.conf == 0.5 and config.nats.url == "nats://bus:4222"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("detecter:\n  conf: 0.3\n", "detecter: unknown key"),
        ("detector:\n  conf: 3\n", "detector.conf"),
        ("detector:\n  engine: cuda\n", "detector.engine"),
        ("streams:\n  - id: bad id\n    url: rtsp://cam/1\n", "streams.0.id"),
        ("streams:\n  - id: a\n    url: ftp://cam/1\n", "streams.0.url"),
        ("streams:\n  - id: a\n", "streams.0.url"),
        ("streams:\n  - {id: a, url: rtsp://c/1}\n  - {id: a, url: rtsp://c/2}\n", "duplicate stream id"),
        ("nats:\n  url: http://bus\n", "nats.url"),
        ("captions:\n  max_window_s: 40\n", "captions.max_window_s"),
        (
            "streams:\n  - id: a\n    url: rtsp://c/1\n    rules:\n"
            "      - {id: r, type: fall}\n      - {id: r, type: fall}\n",
            "streams.0.rules: duplicate rule id 'r'",
        ),
        ("- just\n- a list\n", "top level"),
        ("detector: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), environ={})
    assert needle in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_bad_env_override_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="supervisor.watchdog_s"):
        load_config(write(tmp_path, ""), environ={"VIDSENTRY_SUPERVISOR__WATCHDOG_S": "-1"})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml", environ={})


# -- environment values are read as the setting's type (issue 7, item 11) --------------------


@pytest.mark.parametrize("token", ["null", "~", "abc #xyz", "@tok", "!tok", "[a, b]", "{x: 1}", "'quoted'"])
def test_an_env_token_is_the_string_as_given(tmp_path: Path, token: str) -> None:
    config = load_config(write(tmp_path, ""), environ={"VIDSENTRY_HTTP__API_TOKEN": token})
    assert config.http.api_token is not None and config.http.api_token.get_secret_value() == token


def test_env_strings_numbers_switches_and_lists(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, ""),
        environ={
            "VIDSENTRY_HTTP__HOST": "::",
            "VIDSENTRY_NODE": "yes",  # a string setting: not YAML's true
            "VIDSENTRY_HTTP__PORT": "8081",
            "VIDSENTRY_HTTP__ALLOW_UNAUTHENTICATED": "true",
            "VIDSENTRY_DETECTOR__ENGINE": "onnx-cpu",
            "VIDSENTRY_STREAMS": "[{id: a, url: 'rtsp://cam/1'}]",
        },
    )
    assert config.http.host == "::" and config.node == "yes"
    assert config.http.port == 8081 and config.http.allow_unauthenticated is True
    assert config.detector.engine == "onnx-cpu" and [s.id for s in config.streams] == ["a"]


@pytest.mark.parametrize(
    ("name", "value", "key"),
    [
        ("VIDSENTRY_HTTP__PORT", "s3cret", "http.port (VIDSENTRY_HTTP__PORT)"),
        ("VIDSENTRY_DETECTOR__CONF", "nan", "detector.conf (VIDSENTRY_DETECTOR__CONF)"),
        ("VIDSENTRY_SUPERVISOR__WATCHDOG_S", "1e999", "supervisor.watchdog_s (VIDSENTRY_SUPERVISOR__WATCHDOG_S)"),
        ("VIDSENTRY_STREAMS", "[{id: a, url: 's3cret", "VIDSENTRY_STREAMS: not valid YAML"),
    ],
)
def test_a_bad_env_value_names_the_variable_not_the_value(tmp_path: Path, name: str, value: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, ""), environ={name: value, "VIDSENTRY_HTTP__API_TOKEN": "!s3cret"})
    assert key in str(info.value) and "s3cret" not in str(info.value)


# -- no Infinity or NaN in settings (item 15) ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("streams:\n  - {id: a, url: 'rtsp://c/1', detect_fps: .inf}\n", "streams.0.detect_fps"),
        ("detector:\n  conf: .nan\n", "detector.conf"),
        ("http:\n  sse_heartbeat_s: 1e999\n", "http.sse_heartbeat_s"),
        ("supervisor:\n  backoff_max_s: .inf\n", "supervisor.backoff_max_s"),
        (
            "streams:\n  - id: a\n    url: rtsp://c/1\n    rules:\n"
            "      - {id: z, type: zone, polygon: [[0, 0], [9, .nan], [9, 9]]}\n",
            "streams.0.rules.0.zone.polygon.1.1",
        ),
        ("streams:\n  - id: a\n    url: rtsp://c/1\n    rules:\n      - {id: f, type: fall, for_s: .inf}\n",
         "streams.0.rules.0.fall.for_s"),
    ],
)
def test_non_finite_numbers_are_refused(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), environ={})
    assert f"{key}: Input should be a finite number" in str(info.value)


# -- the file itself (item 20) --------------------------------------------------------------


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"node: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text \(byte 9\)"):
        load_config(path, environ={})


def test_only_regular_files_of_bounded_size_are_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config("/dev/zero", environ={})
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path, environ={})
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as file:
        file.truncate(MAX_CONFIG_BYTES + 1)
    with pytest.raises(ConfigError, match="too large"):
        load_config(huge, environ={})


def test_a_stream_s_stage_switches_reach_its_graph_by_stage_name() -> None:
    from pipelines.captions.stage import STAGE_NAME as CAPTIONS
    from pipelines.clips.stage import STAGE_NAME as CLIPS
    from pipelines.describe.stage import STAGE_NAME as DESCRIBE
    from realtime.config import CameraStreamSettings

    on = CameraStreamSettings(id="cam", url="rtsp://cam.example/live")
    off = CameraStreamSettings(id="cam", url="rtsp://cam.example/live", captions=False, describe=False, clips=False)
    assert on.stages_off() == frozenset()
    # Every switch is named after the stage it turns off (a renamed stage would break the switch).
    assert off.stages_off() == {CAPTIONS, DESCRIBE, CLIPS}
    assert CameraStreamSettings(id="cam", url="rtsp://cam.example/live", audio=False).stages_off() == frozenset()


def test_a_switch_holding_the_stream_s_own_settings_turns_its_stage_on_and_hands_them_to_it() -> None:
    from pipelines.captions.config import CaptionsStreamSettings
    from pipelines.captions.stage import STAGE_NAME as CAPTIONS
    from realtime.streams.spec import stream_spec

    def processing(**settings: Any) -> Any:
        stream = Config.model_validate({"streams": [{"id": "cam", "url": "rtsp://cam.example/live", **settings}]})
        return stream_spec(stream.streams[0]).processing

    own = processing(captions={"model": "base", "language": "ES", "translate": "en"})
    assert own.wants(CAPTIONS) and own.own(CAPTIONS) == CaptionsStreamSettings(model="base", language="es",
                                                                                translate="en")
    assert processing(captions=True).own(CAPTIONS) is None and processing().wants(CAPTIONS)
    off = processing(captions=False)
    assert not off.wants(CAPTIONS) and off.own(CAPTIONS) is None
    # The stream's settings round-trip as the fleet stores them and the API lists them.
    stream = Config.model_validate({"streams": [{"id": "cam", "url": "rtsp://cam.example/live",
                                                 "captions": {"translate": "off"}}]}).streams[0]
    assert stream.model_dump(mode="json")["captions"] == {"model": None, "language": None, "translate": "off"}
    assert type(stream).model_validate_json(stream.model_dump_json()) == stream


def test_a_capability_s_section_joins_the_config_from_the_registry_and_its_errors_name_the_key() -> None:
    import contextlib

    from pydantic import Field, ValidationError

    from pipelines.capabilities import CAPABILITIES
    from pipelines.capability import Capability
    from pipelines.graph.engines import EngineKey
    from pipelines.sections import Section
    from realtime.config import config_model, validation_problems

    class ToySettings(Section):
        enabled: bool = False
        rate: int = Field(1, ge=1, le=10)

    @contextlib.asynccontextmanager
    async def never(_settings: ToySettings, _context: object):  # type: ignore[no-untyped-def]
        yield None

    toy = Capability(key=EngineKey[object]("toy"), section="toy", settings=ToySettings, open=never,
                     build=lambda ctx: None)
    model = config_model([*CAPABILITIES, toy])
    assert model().toy == ToySettings() and model().section("toy").rate == 1  # type: ignore[attr-defined]
    with pytest.raises(ValidationError) as bad:
        model.model_validate({"toy": {"rate": 0, "nope": 1}})
    assert {p["field"] for p in validation_problems(bad.value)} == {"toy.rate", "toy.nope"}
    with pytest.raises(KeyError, match="no config section 'nope'"):
        model().section("nope")


def test_a_stream_has_one_switch_per_capability_that_declares_one_and_config_py_names_none() -> None:
    import re

    import realtime.config
    from pipelines.capabilities import CAPABILITIES
    from realtime.config import CameraStreamSettings, WebRtcStreamSettings

    declared = {c.switch.name for c in CAPABILITIES if c.switch is not None}
    assert declared == {"captions", "describe", "clips"}
    for model in (CameraStreamSettings, WebRtcStreamSettings):
        fields = model.model_fields
        assert {name for name, info in fields.items() if info.json_schema_extra == {"stage_switch": True}} == declared
        assert all(fields[name].default is True and fields[name].description for name in declared)
    source = Path(realtime.config.__file__).read_text()
    assert not re.search(r"pipelines\.(captions|describe|segment|clips)\b", source)
