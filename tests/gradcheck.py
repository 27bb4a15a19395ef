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


def matches_finite_differences(grads, loss, params, names=None, unchanged=None, tol: float = 1e-6) -> bool:
    """Check the hand-written ``grads`` against centred differences of ``loss()`` for each of ``names``
    (default: every key of ``params``): each has its parameter's shape and lies within ``tol``
    (:func:`relative_error`) of them. False, having checked nothing, when the point sits on a kink
    (``unchanged()`` differs between +h and -h): the caller draws another point."""
    names = list(params) if names is None else list(names)
    try:
        numeric = {name: numerical_gradient(loss, params[name], unchanged=unchanged) for name in names}
    except KinkError:
        return False
    for name in names:
        grad = np.asarray(grads[name])
        assert grad.shape == params[name].shape, name
        assert relative_error(grad, numeric[name]) < tol, name
    return True
