"""Pixelate boxes in a clip: the only re-encoding a clip ever gets, on export and on request.

Each frame of the source is decoded, the boxes listed for its time are replaced by a coarse mosaic
(blocks of `block` pixels, their mean colour: the content cannot be read back), and the frame is
encoded again with x264 at the source's size and timestamps. The result is written under a
temporary name and renamed when complete.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from engines.media.files import replacing

Box = tuple[float, float, float, float]  # x1, y1, x2, y2 in source pixels

FRAME_SLACK_S = 0.06  # boxes belong to the frame within this of their time


@dataclass(frozen=True, slots=True)
class Redacted:
    frames: int
    boxes: int  # regions pixelated, over all frames
    bytes: int


def pixelate(image: np.ndarray, box: Box, block: int) -> bool:
    """Mosaic `box` of `image` in place (each block its mean colour); False when the box lies
    outside the picture."""
    height, width = image.shape[:2]
    x1, y1 = max(0, int(box[0])), max(0, int(box[1]))
    x2, y2 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
    if x2 <= x1 or y2 <= y1:
        return False
    region = image[y1:y2, x1:x2]
    cells = (max(1, -(-(x2 - x1) // block)), max(1, -(-(y2 - y1) // block)))
    small = cv2.resize(region, cells, interpolation=cv2.INTER_AREA)
    region[...] = cv2.resize(small, (x2 - x1, y2 - y1), interpolation=cv2.INTER_NEAREST)
    return True


def redact_mp4(src: Path, dst: Path, frames: Sequence[tuple[float, Sequence[Box]]], *, block: int = 16,
               crf: int = 23) -> Redacted:
    """Re-encode `src` into `dst` with, on each frame, the boxes of the latest entry of `frames`
    (time on the clip, its boxes) at or just before the frame's time pixelated."""
    import av

    times = [t for t, _ in frames]
    count = boxes = 0
    with replacing(dst) as tmp, av.open(str(src)) as source, av.open(str(tmp), "w", format="mp4") as out:
        video = source.streams.video[0]
        rate = video.average_rate or 25
        stream = out.add_stream("libx264", rate=rate)
        stream.width, stream.height = video.codec_context.width, video.codec_context.height
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "veryfast", "crf": str(crf)}
        if video.time_base is not None:
            stream.codec_context.time_base = video.time_base
        for frame in source.decode(video):
            image = frame.to_ndarray(format="rgb24")
            at = frame.time if frame.time is not None else count / float(rate)
            index = bisect.bisect_right(times, at + FRAME_SLACK_S) - 1
            if index >= 0 and at - times[index] <= 1.0:  # boxes of a frame long gone are not these
                boxes += sum(pixelate(image, box, block) for box in frames[index][1])
            encoded = av.VideoFrame.from_ndarray(image, format="rgb24")
            encoded.pts = frame.pts
            encoded.time_base = video.time_base
            for packet in stream.encode(encoded):
                out.mux(packet)
            count += 1
        for packet in stream.encode():
            out.mux(packet)
    return Redacted(count, boxes, dst.stat().st_size)
