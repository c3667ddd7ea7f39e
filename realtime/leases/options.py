"""A fleet worker's settings, resolved (the config's `fleet:` section plus --fleet / --node).

They include the worker's `sources:` policy: anyone who can write the fleet's desired bucket could
otherwise make the worker open what no API client may (see realtime.fleet.worker).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from realtime.config import Config
from realtime.leases.records import InvalidFleetName, check_fleet_name
from realtime.sources.policy import SourcePolicy

STREAMS_PER_CORE = 2  # a 2-core box runs a handful of cameras at the default detection rate


def default_capacity() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, STREAMS_PER_CORE * cores)


@dataclass(frozen=True, slots=True)
class FleetOptions:
    name: str
    node: str
    capacity: int
    lease_ttl_s: float
    renew_interval_s: float
    slack: int = 0
    max_streams: int = 1024  # desired streams in the whole fleet
    replicas: int = 1  # JetStream copies of the buckets (nats.replicas)
    # What a desired stream that is not one of this worker's config-file streams may open.
    source_policy: SourcePolicy = SourcePolicy()

    @property
    def orphan_after_s(self) -> float:
        """A stream unowned this long may be taken by any worker with room, share or not."""
        return 2 * self.renew_interval_s


def with_flags(config: Config, *, fleet: str | None, node: str | None) -> Config:
    """The config with `--fleet` / `--node` applied (flags win); ValueError naming the flag."""
    if node is not None:
        node = node.strip()
        if not node or len(node) > 128 or any(ord(ch) < 33 or ord(ch) == 127 for ch in node):
            raise ValueError("--node: 1-128 printable characters without spaces")
        config = config.model_copy(update={"node": node})
    if fleet is not None:
        try:
            check_fleet_name(fleet)
        except InvalidFleetName as exc:
            raise ValueError(f"--fleet: {exc}") from None
        config = config.model_copy(update={"fleet": config.fleet.model_copy(update={"name": fleet})})
    return config


def fleet_options(config: Config) -> FleetOptions | None:
    """This worker's fleet settings, or None when it is in no fleet."""
    fleet = config.fleet
    if fleet.name is None:
        return None
    return FleetOptions(
        name=fleet.name,
        node=config.node,
        capacity=fleet.capacity if fleet.capacity is not None else default_capacity(),
        lease_ttl_s=fleet.lease_ttl_s,
        renew_interval_s=fleet.renew_every_s,
        slack=fleet.slack,
        max_streams=fleet.max_streams,
        replicas=config.nats.replicas,
        source_policy=config.sources.to_policy(),
    )
