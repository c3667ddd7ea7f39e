"""Which unowned streams this worker claims and which of its own it hands back (pure logic).

The fair share is the desired streams spread evenly over the live workers, rounded up, plus
`slack`, and never more than this worker's capacity. A worker claims while below its share;
a stream nobody has taken for `orphan_after_s` may be claimed by any worker with room (so
workers with less capacity than the share do not leave streams unowned). A worker above its
share hands back one stream per round, and only when another live worker is below its own
share and has room, so a stream handed back is taken at once instead of bouncing.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """What a worker says about itself in its node record."""

    streams: int
    capacity: int


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    claim: tuple[str, ...] = ()  # to try to take, best first (another worker may win the race)
    shed: tuple[str, ...] = ()  # to hand back
    share: int = 0  # the fair share this round


def fair_share(desired: int, live_nodes: int, capacity: int, slack: int = 0) -> int:
    """Streams this worker should run: the even spread rounded up plus slack, within capacity."""
    if desired <= 0:
        return 0
    return min(capacity, math.ceil(desired / max(1, live_nodes)) + slack)


def preference(node: str, stream_id: str) -> bytes:
    """Rendezvous order: each worker ranks the streams differently, so racing workers mostly
    go for different streams first."""
    return hashlib.blake2b(f"{node}\0{stream_id}".encode(), digest_size=8).digest()


def plan(
    *,
    node: str,
    desired: Iterable[str],
    owners: Mapping[str, str],
    nodes: Mapping[str, NodeLoad],
    capacity: int,
    slack: int = 0,
    orphaned: Iterable[str] = (),
) -> ClaimPlan:
    """One round's decision.

    `owners` maps leased stream ids to the worker holding them; `nodes` is every live worker
    other than this one; `orphaned` lists desired ids unowned for longer than the grace time.
    """
    wanted = list(desired)
    mine = sorted(sid for sid in wanted if owners.get(sid) == node)
    load = len(mine)
    share = fair_share(len(wanted), len(nodes) + 1, capacity, slack)
    unowned = [sid for sid in wanted if sid not in owners]
    unowned.sort(key=lambda sid: preference(node, sid))
    claim: list[str] = []
    room = min(capacity, share) - load
    if room > 0:
        claim = unowned[:room]
    spare = capacity - load - len(claim)
    if spare > 0:
        late = set(orphaned) - set(claim)
        claim += [sid for sid in unowned if sid in late][:spare]
    shed: tuple[str, ...] = ()
    if load > share and any(_can_take(other, len(wanted), len(nodes) + 1, slack) for other in nodes.values()):
        shed = (max(mine, key=lambda sid: preference(node, sid)),)
    return ClaimPlan(tuple(claim), shed, share)


def _can_take(other: NodeLoad, desired: int, live_nodes: int, slack: int) -> bool:
    return other.streams < fair_share(desired, live_nodes, other.capacity, slack)
