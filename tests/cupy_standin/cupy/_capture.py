"""What the stand-in's device operations do while their stream is capturing a CUDA graph.

Outside capture nothing here runs. Under capture (:func:`cupy.cuda.graph.recording`):

* work into memory that exists (``out=``, in-place operators and methods, ``a[...] = b``, kernel
  launches, device-to-device copies) is recorded as a thunk on the arrays' NumPy memory, not run;
  the call returns what CuPy returns (the ``out`` array, ``None`` for an in-place method);
* work that would allocate a device array (no ``out=``, ``a + b``, ``a.copy()``, creation
  functions, fancy indexing) is refused. Stricter than CuPy, whose pool may hand the capture a
  cached block that the graph then shares with whatever reuses it later: the rule a captured step
  must follow anyway;
* views (basic slicing, ``.T``, ``reshape``/``ravel`` of a contiguous array, ``view``) run at once:
  they launch nothing. A result counts as a view only if it shares memory with an argument;
* reading device memory back (``float()``, ``.get()``, ...) is refused as CuPy refuses it, before
  any CUDA call: a ``RuntimeError`` saying the stream is capturing; the capture stays valid;
* library calls CuPy disables during capture raise its ``NotImplementedError`` naming the library
  (cuBLAS: ``matmul``, ``dot``, ... of floating-point arrays; cuRAND, cuSOLVER, cuSPARSE elsewhere);
  the capture stays valid;
* host-to-device copies are refused (CuPy would stage them through pinned blocks that the graph
  then shares).

The stand-in's own refusals (allocations, host copies) invalidate the capture, as an error inside
a capture does in CUDA (:func:`cupy.cuda.graph.refuse`).
"""
from __future__ import annotations

import inspect

import numpy as np

from cupy.cuda import graph as _graph

# Functions and methods that write their first argument (or self) without an ``out``.
IN_PLACE_FUNCTIONS = {"copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis"}
IN_PLACE_METHODS = {"fill", "sort", "partition", "put", "itemset", "setfield"}
# The position of ``out`` among an ndarray method's arguments (NumPy before 2.0 gives methods no signature).
METHOD_OUT = {"all": 1, "any": 1, "argmax": 1, "argmin": 1, "max": 1, "min": 1, "choose": 1, "dot": 1, "round": 1,
              "clip": 2, "compress": 2, "cumprod": 2, "cumsum": 2, "mean": 2, "prod": 2, "std": 2, "sum": 2, "take": 2,
              "var": 2, "trace": 4}
ADVICE = "allocate it before begin_capture and pass it as out="
# What CuPy computes with cuBLAS on floating-point arrays, and refuses during capture (cupy/cupy#6290).
CUBLAS = {"matmul", "dot", "vdot", "inner", "tensordot", "einsum", "kron"}


def active():
    """The capture the current stream records into, or None (the fast path: no capture in this thread)."""
    return _graph.recording() if getattr(_graph._local, "capture", None) is not None else None


def refuse_allocation(what: str) -> None:
    if active() is not None:
        _graph.refuse(_graph.CAPTURE_UNSUPPORTED,
                      f"allocation during stream capture: {what} would allocate a new device array; {ADVICE}")


def refuse_readback(what: str) -> None:
    """As CuPy: a read-back would synchronise with the capturing stream; refused before CUDA sees it."""
    if active() is not None:
        raise RuntimeError(f"{what} reads device memory back, which needs a synchronization, but the current stream "
                           f"is capturing a CUDA graph")


def refuse_library(library: str, what: str) -> None:
    """As CuPy: calls into ``library`` are disabled during stream capture (cupy/cupy#6290)."""
    if active() is not None:
        raise NotImplementedError(f"calling {library} API during stream capture is currently unsupported ({what}: "
                                  f"CuPy disables {library} while a stream captures; run it outside the captured "
                                  f"region)")


def refuse_cublas(name: str, arrays) -> None:
    """``name`` on floating-point arrays goes to cuBLAS in CuPy, which refuses it during capture."""
    if name in CUBLAS and any(isinstance(a, np.ndarray) and a.dtype.kind in "fc" for a in _arrays(arrays)):
        refuse_library("cuBLAS", name)


def refuse_host_copy(what: str) -> None:
    if active() is not None:
        _graph.refuse(_graph.CAPTURE_UNSUPPORTED,
                      f"{what} copies host memory to the device (and allocates) during stream capture; copy it in "
                      f"before begin_capture")


def _out_argument(fn, name: str, args: tuple, kwargs: dict, method: bool):
    """The ``out`` the call was given (positionally or by name), else None."""
    if kwargs.get("out") is not None:
        return kwargs["out"]
    if isinstance(fn, np.ufunc):
        outs = args[fn.nin:]
        return (outs if len(outs) > 1 else outs[0]) if outs else None
    position = METHOD_OUT.get(name) if method else None
    if not method:
        try:
            parameters = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):  # a C function without a signature: out can only be named
            parameters = []
        position = parameters.index("out") if "out" in parameters else None
    if position is not None and len(args) > position:
        return args[position]
    return None


def _arrays(x):
    """The NumPy arrays and scalars in a result or an argument list, containers searched."""
    if isinstance(x, (np.ndarray, np.generic)):
        yield x
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _arrays(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _arrays(v)


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def allocates(result, sources) -> bool:
    """Whether ``result`` holds memory that none of ``sources`` (NumPy arrays) has: a new device array."""
    sources = [s for s in sources if isinstance(s, np.ndarray)]
    for r in _arrays(result):
        if isinstance(r, np.generic):  # a scalar result: CuPy returns it as a new 0-d array
            return True
        if not any(_root(r) is _root(s) or np.may_share_memory(r, s) for s in sources):
            return True
    return False


def _returned(out):
    """What CuPy returns for ``out``: the array itself (a one-element tuple unpacked)."""
    return out[0] if isinstance(out, tuple) and len(out) == 1 else out


def call(capture, fn, args: tuple, kwargs: dict, what: str, *, self_a: np.ndarray | None = None,
         method: str | None = None):
    """``fn(*args, **kwargs)`` on device arrays while ``capture`` records: recorded when it writes
    memory that exists, run at once when its result is a view, else refused as an allocation.
    ``method``: the name, when ``fn`` is an ndarray method bound to the memory ``self_a``."""
    from cupy._array import unwrap, wrap

    uargs, ukwargs = unwrap(args), unwrap(kwargs)  # host arrays refused here, as outside capture
    name = method or getattr(fn, "__name__", "")
    refuse_cublas(name, (self_a, uargs, ukwargs))
    out = _out_argument(fn, name, args, kwargs, method is not None)
    if out is not None or name in (IN_PLACE_METHODS if method else IN_PLACE_FUNCTIONS):
        if out is not None and any(o is None for o in (out if isinstance(out, tuple) else (out,))):
            refuse_allocation(f"{what} with an output left None")
        _graph.record(capture, lambda: fn(*uargs, **ukwargs), what)
        return _returned(out) if out is not None else None
    result = fn(*uargs, **ukwargs)  # no out: pure, so running it now changes nothing on the device
    if allocates(result, [self_a, *_arrays((uargs, ukwargs))]):
        refuse_allocation(what)
    return wrap(result)


def ufunc(capture, ufunc_, method: str, inputs: tuple, kwargs: dict):
    """A ufunc on device arrays while ``capture`` records (NumPy has put any ``out`` into ``kwargs``)."""
    from cupy._array import unwrap

    what = f"{ufunc_.__name__}" + ("" if method == "__call__" else f".{method}")
    uinputs, ukwargs = unwrap(inputs), unwrap(kwargs)
    refuse_cublas(ufunc_.__name__, uinputs)
    if method == "at":  # unbuffered in place on inputs[0]
        _graph.record(capture, lambda: ufunc_.at(*uinputs, **ukwargs), what)
        return None
    outs = kwargs.get("out")
    if not outs or any(o is None for o in outs):
        refuse_allocation(f"{what} without out=")
    _graph.record(capture, lambda: getattr(ufunc_, method)(*uinputs, **ukwargs), what)
    return _returned(tuple(outs))
