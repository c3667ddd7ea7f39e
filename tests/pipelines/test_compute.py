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


def test_a_model_with_two_workers_runs_two_calls_in_its_turn() -> None:
    shares = ComputeShares({"detector": 0.5, "speech recognizer": 0.5})
    both_inside = threading.Barrier(2, timeout=5.0)  # one call at a time would time out here

    def call() -> None:
        with shares.turn("detector"):
            both_inside.wait()

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not both_inside.broken and shares.stats["detector"].turns == 2


def test_a_model_that_is_due_waits_for_the_running_calls_and_holds_back_new_ones() -> None:
    shares = ComputeShares({"detector": 0.5, "speech recognizer": 0.5})
    order: list[str] = []
    first_inside, release_first = threading.Event(), threading.Event()

    def first_detector_call() -> None:
        with shares.turn("detector"):
            order.append("detector 1 in")
            first_inside.set()
            release_first.wait(5.0)
            order.append("detector 1 out")

    def call(name: str) -> None:
        with shares.turn(name):
            order.append(f"{name} in")

    first = threading.Thread(target=first_detector_call)
    first.start()
    assert first_inside.wait(5.0)
    # The recognizer has used nothing: it is due before the detector's next call.
    recognizer = threading.Thread(target=call, args=("speech recognizer",))
    recognizer.start()
    time.sleep(0.05)
    second = threading.Thread(target=call, args=("detector",))
    second.start()
    time.sleep(0.05)
    assert order == ["detector 1 in"]  # neither starts while the first call runs
    release_first.set()
    for thread in (first, recognizer, second):
        thread.join(5.0)
    assert order == ["detector 1 in", "detector 1 out", "speech recognizer in", "detector in"]
