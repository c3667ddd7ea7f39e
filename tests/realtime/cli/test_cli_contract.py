"""The CLI contract on bad input: exit 2 with one line on stderr, at once, never a traceback
(exit 1, one line, for a NATS server that cannot be reached). Each case is a real process."""

from __future__ import annotations

import os
import socket

import pytest

from tests.support.cli import one_error_line, vidsentry

MISSING = "no-such-clip.mp4"  # every check below comes before the source is opened


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("configs")
    latin1 = where / "latin1.yaml"
    latin1.write_bytes(b"node: caf\xe9\n")
    huge = where / "huge.yaml"
    with huge.open("wb") as file:  # sparse: 5 MiB of zeros that take no disk
        file.truncate(5 * 1024 * 1024)
    fifo = where / "fifo.yaml"
    os.mkfifo(fifo)  # nobody ever writes to it: reading it would wait for ever
    return {"latin1": str(latin1), "huge": str(huge), "fifo": str(fifo)}


@pytest.mark.parametrize(
    ("args", "env", "needles"),
    [
        pytest.param(["--log-level", "bogus", "doctor"], {}, ["--log-level", "bogus", "debug"], id="log-level"),
        pytest.param(["doctor"], {"VIDSENTRY_LOG_LEVEL": "bogus"}, ["VIDSENTRY_LOG_LEVEL"], id="log-level-env"),
        pytest.param(["run", MISSING, "--config", "{latin1}"], {}, ["latin1.yaml", "UTF-8"], id="config-not-utf8"),
        pytest.param(["serve", "--config", "{latin1}"], {}, ["latin1.yaml", "UTF-8"], id="serve-config-not-utf8"),
        pytest.param(["run", MISSING, "--config", "/dev/zero"], {}, ["/dev/zero", "regular file"], id="dev-zero"),
        pytest.param(["serve", "--config", "/dev/zero"], {}, ["/dev/zero", "regular file"], id="serve-dev-zero"),
        pytest.param(["serve", "--config", "{fifo}"], {}, ["fifo.yaml", "regular file"], id="fifo"),
        pytest.param(["serve", "--config", "{huge}"], {}, ["huge.yaml", "MiB"], id="huge-config"),
        pytest.param(["subscribe", "a b"], {}, ["subject", "'a b'"], id="subject-with-space"),
        pytest.param(["subscribe", "a..b"], {}, ["subject"], id="subject-empty-token"),
        pytest.param(["subscribe", "a.>.b"], {}, ["subject", ">"], id="subject-inner-wildcard"),
        pytest.param(["run", MISSING, "--nats-url", "http://x"], {}, ["--nats-url", "nats://"], id="run-nats-url"),
        pytest.param(["serve", "--nats-url", "http://x"], {}, ["--nats-url", "nats://"], id="serve-nats-url"),
        pytest.param(["subscribe", "--nats-url", "http://x"], {}, ["--nats-url"], id="subscribe-nats-url"),
        pytest.param(["run", MISSING, "--duration", "nan"], {}, ["--duration"], id="duration-nan"),
        pytest.param(["run", MISSING, "--duration", "inf"], {}, ["--duration"], id="duration-inf"),
        pytest.param(["run", MISSING, "--detect-fps", "nan"], {}, ["--detect-fps"], id="detect-fps-nan"),
        pytest.param(["run", MISSING, "--conf", "nan"], {}, ["--conf"], id="conf-nan"),
        pytest.param(["subscribe", "--duration", "nan"], {}, ["--duration"], id="subscribe-duration-nan"),
    ],
)
def test_bad_input_is_exit_2_with_one_line(
    configs: dict[str, str], args: list[str], env: dict[str, str], needles: list[str]
) -> None:
    line = one_error_line(vidsentry(*(arg.format(**configs) for arg in args), env=env), 2)
    for needle in needles:
        assert needle in line, line


def test_an_unreachable_nats_is_exit_1_with_one_line() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = vidsentry("subscribe", "--nats-url", f"nats://127.0.0.1:{port}", "--connect-timeout", "0.5")
    line = one_error_line(proc, 1)
    assert f"127.0.0.1:{port}" in line and "unreachable" in line


@pytest.mark.parametrize("token", ["@tok-s3cret", "!tok-s3cret", "tok-s3cret #x"])
def test_an_environment_error_names_the_variable_and_never_shows_the_token(token: str) -> None:
    # The token's value once crashed YAML parsing with a traceback that printed it.
    env = {"VIDSENTRY_HTTP__API_TOKEN": token, "VIDSENTRY_HTTP__PORT": "eighty"}
    line = one_error_line(vidsentry("serve", env=env), 2)
    assert "VIDSENTRY_HTTP__PORT" in line and "http.port" in line
    assert "s3cret" not in line and "eighty" not in line
