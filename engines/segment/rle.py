"""COCO run-length encoding of binary masks.

A COCO RLE is `{"size": [height, width], "counts": ...}`: run lengths over the mask read in
column-major (Fortran) order, alternating 0s and 1s and always starting with a run of 0s (which
may be empty). `counts` is either the list of run lengths ("uncompressed") or COCO's compact
string, in which each run is stored as the difference to the run two before it, in 5-bit
groups offset into printable ASCII (what pycocotools writes and reads).
"""

from __future__ import annotations

from typing import Any

import numpy as np

Rle = dict[str, Any]


def mask_runs(mask: np.ndarray) -> list[int]:
    """Run lengths of a 2-D mask in column-major order, starting with the 0s."""
    if mask.ndim != 2:
        raise ValueError(f"a mask is 2-D, got shape {mask.shape}")
    flat = np.ascontiguousarray(mask.T).ravel().astype(bool, copy=False)
    if flat.size == 0:
        return []
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    runs = np.diff(np.concatenate(([0], edges, [flat.size])))
    return ([0] if flat[0] else []) + runs.tolist()


def runs_to_mask(runs: list[int], size: tuple[int, int]) -> np.ndarray:
    height, width = size
    total = sum(runs)
    if total != height * width or any(r < 0 for r in runs):
        raise ValueError(f"runs cover {total} pixels, the mask has {height * width}")
    values = np.arange(len(runs)) % 2 == 1
    flat = np.repeat(values, runs)
    return flat.reshape(width, height).T.copy()


def compress(runs: list[int]) -> str:
    """Run lengths -> COCO's compact string."""
    out: list[str] = []
    for i, run in enumerate(runs):
        x = run - runs[i - 2] if i > 2 else run
        more = True
        while more:
            c = x & 0x1F
            x >>= 5  # arithmetic shift: negative differences end in all-ones
            more = x != -1 if c & 0x10 else x != 0
            out.append(chr((c | 0x20 if more else c) + 48))
    return "".join(out)


def decompress(text: str) -> list[int]:
    """COCO's compact string -> run lengths."""
    runs: list[int] = []
    p = 0
    while p < len(text):
        x, k, more = 0, 0, True
        while more:
            if p >= len(text):
                raise ValueError("RLE string ends inside a run")
            c = ord(text[p]) - 48
            if not 0 <= c < 64:
                raise ValueError(f"RLE string has an invalid character {text[p]!r}")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
    return runs


def encode(mask: np.ndarray, *, compressed: bool = True) -> Rle:
    """A binary HxW mask -> COCO RLE (compact string counts unless `compressed=False`)."""
    runs = mask_runs(mask)
    height, width = mask.shape
    return {"size": [int(height), int(width)], "counts": compress(runs) if compressed else runs}


def decode(rle: Rle) -> np.ndarray:
    """COCO RLE (either form of counts) -> HxW bool mask."""
    height, width = (int(v) for v in rle["size"])
    counts = rle["counts"]
    if isinstance(counts, bytes):
        counts = counts.decode("ascii")
    runs = decompress(counts) if isinstance(counts, str) else [int(c) for c in counts]
    return runs_to_mask(runs, (height, width))


def area(rle: Rle) -> int:
    counts = rle["counts"]
    runs = decompress(counts) if isinstance(counts, str) else list(counts)
    return int(sum(runs[1::2]))
