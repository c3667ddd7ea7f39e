"""CPU turns between shared models: alone a model never waits; together each gets its share."""

from __future__ import annotations

import threading
import time

import pytest

from pipelines.compute import ComputeShares


def busy(shares: ComputeShares, name: str, seconds: float, until: float) -> None:
    while time.perf_counter() < until:
        with shares.turn(name):
            time.sleep(seconds)


def test_a_model_alone_never_waits() -> None:
    shares = ComputeShares({"detector": 0.5, "speech recognizer": 0.5})
    busy(shares, "detector", 0.002, time.perf_counter() + 0.1)
    stats = shares.stats["detector"]
    assert stats.turns > 10 and stats.waited == 0


@pytest.mark.parametrize("share", [0.5, 0.25])
def test_two_busy_models_split_the_time_by_their_shares(share: float) -> None:
    shares = ComputeShares({"detector": 1 - share, "speech recognizer": share}, half_life_s=0.5)
    until = time.perf_counter() + 1.5
    # The detector's calls are short and always ready; the recognizer's are longer.
    threads = [
        threading.Thread(target=busy, args=(shares, "detector", 0.005, until)),
        threading.Thread(target=busy, args=(shares, "speech recognizer", 0.02, until)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    detector, recognizer = shares.stats["detector"].busy_s, shares.stats["speech recognizer"].busy_s
    assert recognizer / (detector + recognizer) == pytest.approx(share, abs=0.1)
    assert shares.stats["speech recognizer"].waited > 0


def test_an_unknown_model_has_no_share() -> None:
    with pytest.raises(KeyError, match="no compute share"), ComputeShares({"detector": 1.0}).turn("other"):
        pass
