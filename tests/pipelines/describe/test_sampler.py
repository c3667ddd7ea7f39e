"""Frame sampling follows activity: a frame every max_interval_s while nothing happens, as often as
min_interval_s while tracks come and go or the picture moves."""

from __future__ import annotations

import numpy as np

from pipelines.describe.sampler import FrameSampler

STILL = np.full((180, 320, 3), 90, np.uint8)


def moved(x: int) -> np.ndarray:
    image = STILL.copy()
    image[40:160, x : x + 80] = 230  # a bright figure walking across
    return image


def taken(sampler: FrameSampler, times: np.ndarray, image: np.ndarray | None = STILL) -> list[float]:
    return [float(t) for t in times if sampler.offer(float(t), image)]


def test_a_still_scene_is_sampled_at_the_max_interval() -> None:
    sampler = FrameSampler(1.0, 10.0, motion_threshold=6.0)
    got = taken(sampler, np.arange(0.0, 60.0, 0.1))
    assert np.allclose(got, [0, 10, 20, 30, 40, 50], atol=0.11)
    assert sampler.reasons["max_interval"] == 5


def test_activity_takes_the_next_frame_allowed_by_the_min_interval() -> None:
    sampler = FrameSampler(1.0, 10.0, motion_threshold=6.0)
    assert sampler.offer(0.0, STILL)
    sampler.note_activity()  # a track started
    assert not sampler.offer(0.5, STILL)  # too soon
    assert sampler.offer(1.0, STILL)
    assert not sampler.offer(2.5, STILL)  # that activity was used up
    for _ in range(3):
        sampler.note_activity()
    assert sampler.offer(2.6, STILL)
    assert sampler.reasons["activity"] == 2


def test_motion_samples_at_the_min_interval_and_calm_returns_to_the_max() -> None:
    sampler = FrameSampler(1.0, 10.0, motion_threshold=6.0)
    times = np.arange(0.0, 30.0, 0.25)
    got = []
    for t in times:
        walking = 5.0 <= t < 15.0
        image = moved(int((t - 5.0) * 20)) if walking else STILL
        if sampler.offer(float(t), image):
            got.append(float(t))
    during = [t for t in got if 5.0 <= t < 15.0]
    assert len(during) >= 8  # about one a second while someone walks
    after = [t for t in got if t >= 16.0]
    assert len(after) <= 2  # calm again: back to every ten seconds
    assert sampler.reasons["motion"] >= 8


def test_small_noise_is_not_motion() -> None:
    sampler = FrameSampler(1.0, 10.0, motion_threshold=6.0)
    rng = np.random.default_rng(0)
    noisy = [np.clip(STILL.astype(int) + rng.integers(-4, 5, STILL.shape), 0, 255).astype(np.uint8) for _ in range(40)]
    got = [t for t, image in zip(np.arange(0.0, 10.0, 0.25), noisy, strict=True) if sampler.offer(float(t), image)]
    assert got == [0.0]
