"""``cupy.linalg``: NumPy's, on device arrays only, results as device arrays. During stream capture
the solvers and decompositions raise CuPy's ``NotImplementedError`` (cuSOLVER is disabled there)."""
from __future__ import annotations

import numpy as _np

from cupy import _capture
from cupy._array import unwrap as _unwrap, wrap as _wrap

CUSOLVER = {"cholesky", "qr", "svd", "eig", "eigh", "eigvals", "eigvalsh", "solve", "lstsq", "inv", "pinv", "det",
            "slogdet", "matrix_rank", "tensorsolve", "tensorinv"}


def __getattr__(name):
    target = getattr(_np.linalg, name, None)
    if target is None or not callable(target) or name.startswith("_"):
        raise AttributeError(f"module 'cupy.linalg' has no attribute {name!r}")

    def function(*args, **kwargs):
        capture = _capture.active()
        if capture is not None:
            if name in CUSOLVER:
                _capture.refuse_library("cuSOLVER", f"cupy.linalg.{name}")
            return _capture.call(capture, target, args, kwargs, f"cupy.linalg.{name}")
        return _wrap(target(*_unwrap(args), **_unwrap(kwargs)))

    function.__name__ = name
    return function
