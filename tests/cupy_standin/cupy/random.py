"""``cupy.random``: NumPy's generators, results as device arrays."""
from __future__ import annotations

import numpy as _np

from cupy._array import unwrap as _unwrap, wrap as _wrap


class Generator:
    def __init__(self, bit_generator):
        self._g = _np.random.default_rng(bit_generator)

    def __getattr__(self, name):
        attr = getattr(self._g, name)
        if not callable(attr):
            return attr

        def method(*args, **kwargs):
            return _wrap(attr(*_unwrap(args), **_unwrap(kwargs)))

        return method


def default_rng(seed=None):
    return Generator(seed)


_legacy = _np.random.RandomState()


def seed(seed=None):
    _legacy.seed(seed)


def __getattr__(name):
    attr = getattr(_legacy, name, None)
    if attr is None or not callable(attr):
        raise AttributeError(f"module 'cupy.random' has no attribute {name!r}")

    def function(*args, **kwargs):
        return _wrap(attr(*_unwrap(args), **_unwrap(kwargs)))

    return function
