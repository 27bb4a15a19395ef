"""The stand-in's device array: NumPy memory behind CuPy's rules.

What CuPy refuses, this refuses, with CuPy's exception type: an implicit conversion to NumPy
(``numpy.asarray``, ``h5py``, anything that calls ``__array__``), and any mix with a NumPy array
in arithmetic, a ufunc or a ``cupy``/``numpy`` function (only ``cupy.asarray``/``cupy.array`` copy a
host array in; indices and assigned values may be host arrays, as CuPy copies them). Reductions
and single-element indexing give 0-d device arrays, as CuPy's do; ``float()``, ``int()``,
``bool()``, ``.item()``, ``.get()`` and ``cupy.asnumpy`` bring values back.

While the current stream captures a CUDA graph, every operation goes through :mod:`cupy._capture`
(recorded, run as a view, or refused); outside capture that module is never called.
"""
from __future__ import annotations

import numbers
import operator

import numpy as np

from cupy import _capture

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array "
            "explicitly.")


def _unsupported(x) -> TypeError:
    return TypeError(f"Unsupported type {type(x)}")


def wrap(x):
    """NumPy results as device arrays (scalars as 0-d arrays, as CuPy returns them); containers recursively."""
    if isinstance(x, np.ndarray):
        return ndarray._from_numpy(x)
    if isinstance(x, np.generic) and not isinstance(x, (np.str_, np.bytes_, np.void)):
        return ndarray._from_numpy(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(wrap(v) for v in x)
    if isinstance(x, list):
        return [wrap(v) for v in x]
    return x


def unwrap(x, *, host_ok: bool = False):
    """Device arrays to their NumPy memory for the computation; a host array is refused unless ``host_ok``."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray) and not host_ok:
        raise _unsupported(x)
    if isinstance(x, tuple):
        return tuple(unwrap(v, host_ok=host_ok) for v in x)
    if isinstance(x, list):
        return [unwrap(v, host_ok=host_ok) for v in x]
    if isinstance(x, dict):
        return {k: unwrap(v, host_ok=host_ok) for k, v in x.items()}
    return x


class MemoryPointer:
    """``a.data``: the address of the array's first element, and device-to-device copies."""

    def __init__(self, owner: np.ndarray):
        self._owner = owner
        self.ptr = int(owner.__array_interface__["data"][0]) if owner.size else 0
        self.mem = self

    def copy_from_device_async(self, src: "MemoryPointer", size: int, stream=None) -> None:
        import ctypes

        from cupy.cuda import graph

        if size > self._owner.nbytes or size > src._owner.nbytes:
            raise ValueError(f"copy of {size} bytes is larger than the buffers ({src._owner.nbytes}, {self._owner.nbytes})")
        capture = graph.recording(stream)
        if capture is not None:  # the owners are kept alive by the thunk, as the graph would need them
            dst_owner, src_owner, dst, source = self._owner, src._owner, self.ptr, src.ptr
            graph.record(capture, lambda: (dst_owner, src_owner, ctypes.memmove(dst, source, size)), "memcpy")
            return
        ctypes.memmove(self.ptr, src.ptr, size)

    def copy_from_device(self, src: "MemoryPointer", size: int) -> None:
        """As CuPy's: a synchronous copy on the legacy default stream, whatever the current stream."""
        from cupy.cuda import Stream

        self.copy_from_device_async(src, size, Stream.null)


class ndarray:
    """A CuPy array whose memory is a NumPy array (``_a``); the only device is 0."""

    __slots__ = ("_a",)
    __array_priority__ = 1000  # NumPy defers binary operators to this class

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        _capture.refuse_allocation("cupy.ndarray(shape)")
        self._a = np.empty(shape, dtype=dtype, order=order)

    @classmethod
    def _from_numpy(cls, a: np.ndarray) -> "ndarray":
        obj = cls.__new__(cls)
        obj._a = a
        return obj

    # -- NumPy's protocols: conversion refused, ufuncs and functions computed on device arrays only.
    def __array__(self, dtype=None, copy=None):
        raise TypeError(IMPLICIT)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        for x in list(inputs) + list(kwargs.get("out", ())):
            if not isinstance(x, (ndarray, numbers.Number, np.generic, bool)):
                if isinstance(x, np.ndarray):
                    raise _unsupported(x)
                return NotImplemented
        capture = _capture.active()
        if capture is not None:
            return _capture.ufunc(capture, ufunc, method, inputs, kwargs)
        if "out" in kwargs:
            kwargs["out"] = tuple(unwrap(o) for o in kwargs["out"])
        return wrap(getattr(ufunc, method)(*unwrap(inputs), **kwargs))

    def __array_function__(self, func, types, args, kwargs):
        if not all(issubclass(t, ndarray) for t in types):
            return NotImplemented
        capture = _capture.active()
        if capture is not None:
            return _capture.call(capture, func, args, kwargs, f"numpy.{func.__name__}")
        return wrap(func(*unwrap(args), **unwrap(kwargs)))

    # -- Attributes.
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: ndarray._from_numpy(self._a.T))
    real = property(lambda self: wrap(self._a.real))
    imag = property(lambda self: wrap(self._a.imag))
    data = property(lambda self: MemoryPointer(self._a))

    @property
    def base(self):
        return None if self._a.base is None else ndarray._from_numpy(self._a.base)

    @property
    def device(self):
        from cupy.cuda import Device

        return Device(0)

    # -- Host transfers: the explicit ways out.
    def get(self, stream=None, order="C", out=None, blocking=True):
        _capture.refuse_readback("cupy.ndarray.get()")
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            out[...] = self._a
            return out
        return np.array(self._a, order=order, copy=True)

    def set(self, arr, stream=None):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray; got {type(arr)}")
        _capture.refuse_host_copy("cupy.ndarray.set()")
        if arr.shape != self._a.shape or arr.dtype != self._a.dtype:
            raise ValueError(f"Shape or dtype mismatch: {arr.shape} {arr.dtype} into {self._a.shape} {self._a.dtype}")
        self._a[...] = arr

    def item(self, *args):
        _capture.refuse_readback("cupy.ndarray.item()")
        return self._a.item(*args)

    def tolist(self):
        _capture.refuse_readback("cupy.ndarray.tolist()")
        return self._a.tolist()

    def __float__(self):
        _capture.refuse_readback("float()")
        return float(self._a)

    def __int__(self):
        _capture.refuse_readback("int()")
        return int(self._a)

    def __complex__(self):
        _capture.refuse_readback("complex()")
        return complex(self._a)

    def __bool__(self):
        _capture.refuse_readback("bool()")
        return bool(self._a)

    def __index__(self):
        _capture.refuse_readback("operator.index()")
        return operator.index(self._a)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        if _capture.active() is not None:  # each row a view, as CuPy's
            return (self[i] for i in range(self._a.shape[0]))
        return (ndarray._from_numpy(self._a[i]) for i in range(self._a.shape[0]))

    def __repr__(self):
        _capture.refuse_readback("repr()")
        return repr(self._a).replace("array(", "array(", 1)

    def __str__(self):
        _capture.refuse_readback("str()")
        return str(self._a)

    def __format__(self, spec):
        _capture.refuse_readback("format()")
        return format(self._a.item() if self._a.ndim == 0 else self._a, spec)

    def __reduce__(self):  # CuPy arrays pickle; they come back as device arrays
        _capture.refuse_readback("pickling")
        return (_from_host, (np.array(self._a),))

    def __copy__(self):
        _capture.refuse_allocation("copy.copy of an array")
        return ndarray._from_numpy(self._a.copy())

    def __deepcopy__(self, memo):
        _capture.refuse_allocation("copy.deepcopy of an array")
        return ndarray._from_numpy(self._a.copy())

    __hash__ = None

    # -- Indexing: host indices and values are copied over, as CuPy does.
    def __getitem__(self, key):
        capture = _capture.active()
        if capture is not None:
            return self._view_under_capture(key)
        return wrap(self._a[unwrap(key, host_ok=True)])

    def __setitem__(self, key, value):
        host_value = isinstance(value, (np.ndarray, list, tuple))
        if isinstance(value, ndarray):
            value = value._a
        elif not isinstance(value, (numbers.Number, np.generic, np.ndarray, list, tuple)):
            raise _unsupported(value)
        capture = _capture.active()
        if capture is not None:
            self._record_setitem(capture, key, value, host_value)
            return
        self._a[unwrap(key, host_ok=True)] = value

    def _view_under_capture(self, key):
        """``self[key]`` during capture: a view, run now (an element as a 0-d view, as CuPy's); a copy
        (fancy or boolean indexing) would allocate and is refused."""
        ukey = unwrap(key, host_ok=True)
        result = self._a[ukey]
        if isinstance(result, np.generic):
            result = self._a[(ukey if isinstance(ukey, tuple) else (ukey,)) + (Ellipsis,)]
        if _capture.allocates(result, [self._a]):
            _capture.refuse_allocation("indexing that copies (an index array or a mask)")
        return wrap(result)

    def _record_setitem(self, capture, key, value, host_value: bool) -> None:
        """``self[key] = value`` during capture, recorded: device arrays (value, index arrays) by
        reference, scalars by value. Host values or indices would be copied to the device: refused."""
        from cupy.cuda import graph

        if host_value:
            _capture.refuse_host_copy("assigning host values (a[...] = numpy array or list)")
        if any(isinstance(k, (np.ndarray, list)) for k in (key if isinstance(key, tuple) else (key,))):
            _capture.refuse_host_copy("indexing with a host array or list")
        target, ukey = self._a, unwrap(key, host_ok=True)
        graph.record(capture, lambda: target.__setitem__(ukey, value), "setitem")

    # -- Every other method: NumPy's, on device arrays only, results as device arrays.
    def __getattr__(self, name):
        if name.startswith("__") or name in ("ctypes", "tofile", "tobytes", "dump", "dumps"):
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        attr = getattr(self._a, name)
        if not callable(attr):
            return wrap(attr)

        def method(*args, **kwargs):
            capture = _capture.active()
            if capture is not None:
                return _capture.call(capture, attr, args, kwargs, f"cupy.ndarray.{name}", self_a=self._a, method=name)
            return wrap(attr(*unwrap(args), **unwrap(kwargs)))

        method.__name__ = name
        return method


ndarray.__module__ = "cupy"
ndarray.__qualname__ = ndarray.__name__ = "ndarray"


def _from_host(a: np.ndarray) -> ndarray:
    return ndarray._from_numpy(a)


def _binary(ufunc):
    def op(self, other):
        if not isinstance(other, (ndarray, numbers.Number, np.generic, np.ndarray)):
            return NotImplemented
        return ufunc(self, other)

    def rop(self, other):
        if not isinstance(other, (ndarray, numbers.Number, np.generic, np.ndarray)):
            return NotImplemented
        return ufunc(other, self)

    def iop(self, other):
        if not isinstance(other, (ndarray, numbers.Number, np.generic, np.ndarray)):
            return NotImplemented
        ufunc(self, other, out=(self,))
        return self

    return op, rop, iop


for _name, _ufunc in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                      ("floordiv", np.floor_divide), ("mod", np.remainder), ("pow", np.power),
                      ("matmul", np.matmul), ("and", np.bitwise_and), ("or", np.bitwise_or),
                      ("xor", np.bitwise_xor), ("lshift", np.left_shift), ("rshift", np.right_shift)]:
    _op, _rop, _iop = _binary(_ufunc)
    setattr(ndarray, f"__{_name}__", _op)
    setattr(ndarray, f"__r{_name}__", _rop)
    setattr(ndarray, f"__i{_name}__", _iop)
for _name, _ufunc in [("lt", np.less), ("le", np.less_equal), ("eq", np.equal), ("ne", np.not_equal),
                      ("gt", np.greater), ("ge", np.greater_equal)]:
    setattr(ndarray, f"__{_name}__", _binary(_ufunc)[0])
for _name, _ufunc in [("neg", np.negative), ("pos", np.positive), ("abs", np.absolute), ("invert", np.invert)]:
    setattr(ndarray, f"__{_name}__", lambda self, _u=_ufunc: _u(self))
