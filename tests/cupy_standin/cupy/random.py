"""``cupy.random``: NumPy's generators, results as device arrays.

Refused during stream capture with CuPy's ``NotImplementedError`` (CuPy disables cuRAND there)."""
from __future__ import annotations

import numpy as _np

from cupy import _capture
from cupy._array import unwrap as _unwrap, wrap as _wrap


def _refuse_under_capture(what: str) -> None:
    _capture.refuse_library("cuRAND", what)


class Generator:
    def __init__(self, bit_generator):
        self._g = _np.random.default_rng(bit_generator)

    def __getattr__(self, name):
        attr = getattr(self._g, name)
        if not callable(attr):
            return attr

        def method(*args, **kwargs):
            _refuse_under_capture(f"cupy.random.Generator.{name}")
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
        _refuse_under_capture(f"cupy.random.{name}")
        return _wrap(attr(*_unwrap(args), **_unwrap(kwargs)))

    return function
