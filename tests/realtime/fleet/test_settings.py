"""The fleet's settings: `fleet: NAME` shorthand, errors that name the key, the CLI flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from realtime.config import Config, ConfigError, load_config
from realtime.leases.options import default_capacity, fleet_options, with_flags


def config_from(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config(path, environ={})


def test_no_fleet_by_default_and_a_name_alone_takes_every_default(tmp_path: Path) -> None:
    assert fleet_options(config_from(tmp_path, "{}\n")) is None
    options = fleet_options(config_from(tmp_path, "fleet: cams\nnode: w7\n"))
    assert options is not None and options.name == "cams" and options.node == "w7"
    assert options.lease_ttl_s == 9.0 and options.renew_interval_s == 3.0 and options.capacity == default_capacity()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("fleet: {name: 'a b'}\n", "fleet.name"),
        ("fleet: {name: x, capacity: 0}\n", "fleet.capacity"),
        ("fleet: {name: x, lease_ttl_s: 0.5}\n", "fleet.lease_ttl_s"),
        ("fleet: {name: x, lease_ttl_s: 3, renew_interval_s: 2}\n", "renew_interval_s"),
        ("fleet: {name: x, leases: 3}\n", "fleet.leases"),
    ],
)
def test_bad_fleet_settings_are_errors_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_from(tmp_path, text)


def test_flags_win_over_the_config_and_bad_ones_name_the_flag(tmp_path: Path) -> None:
    config = config_from(tmp_path, "fleet: {name: a, capacity: 3}\nnode: n1\n")
    flagged = with_flags(config, fleet="b", node="n2")
    assert flagged.fleet.name == "b" and flagged.fleet.capacity == 3 and flagged.node == "n2"
    with pytest.raises(ValueError, match="--fleet"):
        with_flags(config, fleet="no/slash", node=None)
    with pytest.raises(ValueError, match="--node"):
        with_flags(config, fleet=None, node=" ")
