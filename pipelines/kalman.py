"""Constant-velocity Kalman filter on (cx, cy, aspect, height), as SORT/ByteTrack use it.

Noise scales with box height, so near and far objects are tracked alike.
"""

from __future__ import annotations

import numpy as np

_NDIM = 4
_STD_POSITION = 1.0 / 20
_STD_VELOCITY = 1.0 / 160

_MOTION = np.eye(2 * _NDIM)
_MOTION[:_NDIM, _NDIM:] = np.eye(_NDIM)
_UPDATE = np.eye(_NDIM, 2 * _NDIM)


def xyxy_to_xyah(box: np.ndarray) -> np.ndarray:
    w = box[2] - box[0]
    h = max(float(box[3] - box[1]), 1e-6)
    return np.array([box[0] + w / 2, box[1] + h / 2, w / h, h], dtype=np.float64)


def xyah_to_xyxy(state: np.ndarray) -> np.ndarray:
    cx, cy, a, h = state[:4]
    w = a * h
    return np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dtype=np.float32)


class KalmanBoxFilter:
    """One track's filter state: mean (8,) and covariance (8, 8)."""

    __slots__ = ("covariance", "mean")

    def __init__(self, box_xyxy: np.ndarray) -> None:
        measurement = xyxy_to_xyah(box_xyxy)
        self.mean = np.concatenate([measurement, np.zeros(_NDIM)])
        h = measurement[3]
        std = [
            2 * _STD_POSITION * h,
            2 * _STD_POSITION * h,
            1e-2,
            2 * _STD_POSITION * h,
            10 * _STD_VELOCITY * h,
            10 * _STD_VELOCITY * h,
            1e-5,
            10 * _STD_VELOCITY * h,
        ]
        self.covariance = np.diag(np.square(std))

    def predict(self) -> None:
        h = self.mean[3]
        std = [_STD_POSITION * h, _STD_POSITION * h, 1e-2, _STD_POSITION * h]
        std += [_STD_VELOCITY * h, _STD_VELOCITY * h, 1e-5, _STD_VELOCITY * h]
        self.mean = _MOTION @ self.mean
        self.covariance = _MOTION @ self.covariance @ _MOTION.T + np.diag(np.square(std))

    def update(self, box_xyxy: np.ndarray) -> None:
        measurement = xyxy_to_xyah(box_xyxy)
        h = self.mean[3]
        std = [_STD_POSITION * h, _STD_POSITION * h, 1e-1, _STD_POSITION * h]
        projected_mean = _UPDATE @ self.mean
        projected_cov = _UPDATE @ self.covariance @ _UPDATE.T + np.diag(np.square(std))
        gain = np.linalg.solve(projected_cov, (self.covariance @ _UPDATE.T).T).T
        self.mean = self.mean + gain @ (measurement - projected_mean)
        self.covariance = self.covariance - gain @ projected_cov @ gain.T

    def box(self) -> np.ndarray:
        return xyah_to_xyxy(self.mean)
