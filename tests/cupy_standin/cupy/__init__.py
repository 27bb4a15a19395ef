"""A strict stand-in for CuPy, for tests on machines without a GPU (never shipped: it lives in tests/).

``tests/conftest.py`` puts this folder first on ``sys.path`` (fixture ``gpu_cupy``) where no real
GPU answers, so ``import cupy`` in ksae_cupy gets this module and every ``xp = cupy`` line runs.
It behaves like CuPy wherever our code could go wrong, and refuses what CuPy refuses:

* arrays (:mod:`cupy._array`): NumPy memory, CuPy's conversion and mixing rules;
* kernels (:mod:`cupy._raw`): ``RawModule``/``RawKernel`` run the CUDA source unmodified through
  the CUDA host emulator of ``tests/gpu/cuda_host`` (compiled with g++), every launch under a
  rotating schedule of block, thread and warp orders; scalar arguments must be NumPy scalars of the
  parameter's exact C type; an H100's grid, block and shared-memory limits (and the opt-in
  attribute) are enforced;
* CUDA graphs (:mod:`cupy.cuda.graph`, :mod:`cupy._capture`): ``stream.begin_capture()`` records
  device work instead of running it, ``Graph.launch`` replays it; allocating, reading back or
  synchronising during capture is refused;
* ``cupyx.scipy.sparse`` over SciPy with cuSPARSE's restrictions; ``cupy.cuda`` (runtime, Device,
  Stream, Event) reporting an H100; ``cupy.cuda.nccl`` over threads or MPI ranks.

What it cannot tell is listed in ``tests/cupy_standin/README.md``.
"""
from __future__ import annotations

import numpy as _np

from cupy import _capture
from cupy._array import IMPLICIT, ndarray, unwrap as _unwrap, wrap as _wrap
from cupy import cuda, linalg, random  # noqa: F401
from cupy._raw import RawKernel, RawModule  # noqa: F401

__version__ = "14.0.0+ksae.standin"
STANDIN = True  # how tests tell the stand-in from CuPy

# Creation from host data: the only functions that take NumPy arrays.
_HOST_IN = {"asarray", "array", "asanyarray"}
# NumPy names that are not functions of arrays (types, constants): passed through.
_PASSTHROUGH = {"dtype", "iinfo", "finfo", "result_type", "promote_types", "can_cast", "isscalar", "ndim",
                "issubdtype", "newaxis", "pi", "e", "inf", "nan", "integer", "floating", "signedinteger",
                "unsignedinteger", "number", "generic", "bool_", "float16", "float32", "float64", "int8", "int16",
                "int32", "int64", "uint8", "uint16", "uint32", "uint64", "intp", "uintp", "complex64",
                "complex128", "byte", "ubyte", "short", "ushort", "intc", "uintc", "longlong", "ulonglong",
                "half", "single", "double", "csingle", "cdouble", "float_", "complex_"}


def asarray(a, dtype=None, order=None, *, blocking=False):
    if isinstance(a, ndarray):
        return a if dtype is None or _np.dtype(dtype) == a.dtype else a.astype(dtype)
    _capture.refuse_host_copy("cupy.asarray of host data")
    return ndarray._from_numpy(_np.array(_unwrap(a, host_ok=True), dtype=dtype, order=order or "K", copy=True))


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    if isinstance(obj, ndarray):
        _capture.refuse_allocation("cupy.array (a copy)")
    else:
        _capture.refuse_host_copy("cupy.array of host data")
    return ndarray._from_numpy(_np.array(_unwrap(obj, host_ok=True), dtype=dtype, copy=True, order=order, ndmin=ndmin))


asanyarray = asarray


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    if isinstance(a, ndarray):
        return a.get(order=order, out=out)
    return _np.asarray(a, order=order)


def get_array_module(*args):
    import numpy

    return __import__(__name__) if any(isinstance(a, ndarray) for a in args) else numpy


class _MemoryPool:
    def free_all_blocks(self, stream=None):
        pass

    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def set_limit(self, size=None, fraction=None):
        pass


_POOL, _PINNED_POOL = _MemoryPool(), _MemoryPool()


def get_default_memory_pool():
    return _POOL


def get_default_pinned_memory_pool():
    return _PINNED_POOL


def __getattr__(name):
    if name in _PASSTHROUGH:
        return getattr(_np, name)
    target = getattr(_np, name, None)
    if target is None or not callable(target) or name.startswith("_"):
        raise AttributeError(f"module 'cupy' has no attribute {name!r}")

    def function(*args, **kwargs):
        capture = _capture.active()
        if capture is not None:
            return _capture.call(capture, target, args, kwargs, f"cupy.{name}")
        return _wrap(target(*_unwrap(args), **_unwrap(kwargs)))

    function.__name__ = name
    function.__qualname__ = name
    function.__module__ = "cupy"
    globals()[name] = function  # made once per name
    return function
