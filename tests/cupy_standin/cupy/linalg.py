"""``cupy.linalg``: NumPy's, on device arrays only, results as device arrays."""
from __future__ import annotations

import numpy as _np

from cupy._array import unwrap as _unwrap, wrap as _wrap


def __getattr__(name):
    target = getattr(_np.linalg, name, None)
    if target is None or not callable(target) or name.startswith("_"):
        raise AttributeError(f"module 'cupy.linalg' has no attribute {name!r}")

    def function(*args, **kwargs):
        return _wrap(target(*_unwrap(args), **_unwrap(kwargs)))

    function.__name__ = name
    return function
