"""Centred finite differences in float64, shared by the gradient-check tests."""
from __future__ import annotations

import numpy as np


def numerical_gradient(f, x: np.ndarray, h: float = 1e-6, unchanged=None) -> np.ndarray:
    """Centred-difference gradient of the scalar ``f()`` with respect to ``x`` (in place).

    ``unchanged()``, when given, returns a fingerprint of the non-differentiable state
    (e.g. the kept top-k support); a coordinate whose +h and -h evaluations disagree on it
    raises :class:`KinkError`, so the caller redraws the point rather than loosening the
    tolerance.
    """
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        f_plus, state_plus = f(), unchanged() if unchanged else None
        flat[i] = old - h
        f_minus, state_minus = f(), unchanged() if unchanged else None
        flat[i] = old
        if unchanged and not np.array_equal(state_plus, state_minus):
            raise KinkError(f"support changed at coordinate {i}")
        gflat[i] = (f_plus - f_minus) / (2 * h)
    return grad


class KinkError(Exception):
    """The top-k support changed between x+h and x-h: redraw the point."""


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max(|a|, |b|, tiny): scale-free comparison of two gradients."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), np.max(np.abs(b)), 1e-12))
