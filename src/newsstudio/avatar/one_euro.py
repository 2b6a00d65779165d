"""One-Euro low-pass filter (Casiez et al. 2012) for tracked landmarks: steady when still, no lag when fast."""
from __future__ import annotations

import math

import numpy as np


class OneEuroFilter:
    """One-Euro low-pass filter over a (N, 2) point set, adaptive per point.

    cutoff = min_cutoff + beta * speed, speed in units of ``scale`` per second (we pass the
    face height, so the settings are resolution independent). Still points get
    ``min_cutoff`` Hz (strong smoothing), fast points get little. Call ``reset()`` at a cut.
    """

    def __init__(self, min_cutoff: float = 1.5, beta: float = 60.0, d_cutoff: float = 5.0):
        self.min_cutoff = float(min_cutoff)
        self.beta = float(beta)
        self.d_cutoff = float(d_cutoff)
        self.reset()

    def reset(self) -> None:
        self._x: np.ndarray | None = None
        self._dx: np.ndarray | None = None

    @staticmethod
    def _alpha(cutoff: np.ndarray | float, dt: float) -> np.ndarray | float:
        tau = 1.0 / (2.0 * math.pi * cutoff)
        return 1.0 / (1.0 + tau / dt)

    def __call__(self, x: np.ndarray, dt: float, scale: float = 1.0) -> np.ndarray:
        x = np.asarray(x, np.float64)
        if self._x is None or self._x.shape != x.shape:
            self._x = x.copy()
            self._dx = np.zeros_like(x)
            return x.astype(np.float32)
        dx = (x - self._x) / (dt * max(scale, 1e-6))
        a_d = self._alpha(self.d_cutoff, dt)
        self._dx = a_d * dx + (1.0 - a_d) * self._dx
        speed = np.linalg.norm(self._dx, axis=-1, keepdims=True)
        a = self._alpha(self.min_cutoff + self.beta * speed, dt)
        self._x = a * x + (1.0 - a) * self._x
        return self._x.astype(np.float32)
