"""The frames that flow between stages: a decoded picture is converted to RGB once, on first use."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from pipelines.frames import DeferredImage, VideoFrame


def test_a_deferred_picture_is_converted_once_on_first_use_whatever_thread_asks() -> None:
    calls: list[str] = []
    started = threading.Event()

    def convert() -> np.ndarray:
        calls.append(threading.current_thread().name)
        started.wait(1.0)  # the other threads ask while this conversion runs
        return np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)[:, ::-1]  # not contiguous

    frame = VideoFrame("cam", 1, 0.5, 0.0, DeferredImage(3, 2, convert))
    assert (frame.width, frame.height) == (3, 2) and calls == []  # the size needs no conversion
    stamped = dataclasses.replace(frame, t=9.0)  # the graph's tee stamps a copy: it shares the picture
    seen: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda f=f: seen.append(f.image)) for f in (frame, stamped, frame)]
    for thread in threads:
        thread.start()
    started.set()
    for thread in threads:
        thread.join(5)
    assert len(calls) == 1 and len(seen) == 3
    assert all(image is seen[0] for image in seen)
    assert seen[0].flags.c_contiguous and seen[0].shape == (2, 3, 3)
    assert isinstance(stamped.pixels, DeferredImage) and stamped.pixels.converted


def test_an_array_is_the_picture_itself() -> None:
    image = np.zeros((4, 6, 3), np.uint8)
    frame = VideoFrame("cam", 1, 0.0, 0.0, image)
    assert frame.image is image and (frame.width, frame.height) == (6, 4)
