"""``cupyx.scipy.sparse`` of the stand-in: SciPy's CSR/CSC matrices under cuSPARSE's rules.

Refused as cupyx refuses: host (NumPy) arrays for data, indices or indptr; data other than bool,
float32, float64, complex64, complex128; index arrays that are not integers; a product with a host
array. Products give device arrays. Index arrays keep int32 when the values fit (as cupyx does).
During stream capture (CUDA graphs) a product raises CuPy's ``NotImplementedError`` (cuSPARSE is
disabled there), building a matrix or summing it allocates and is refused, and ``get`` is a
read-back, refused too (:mod:`cupy._capture`).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as _sp

from cupy import _capture
from cupy._array import ndarray

_DATA_CHARS = "?fdFD"


def _dense(x, what: str) -> np.ndarray:
    if not isinstance(x, ndarray):
        raise ValueError(f"{what} must be a cupy.ndarray (cupyx.scipy.sparse takes device arrays only); "
                         f"got {type(x).__name__}")
    return x._a


class _Compressed:
    format = ""

    def __init__(self, arg1, shape=None, dtype=None, copy=False):
        _capture.refuse_allocation(f"cupyx.scipy.sparse.{self.format}_matrix")
        if isinstance(arg1, _Compressed):
            self._m = arg1._m.asformat(self.format, copy=copy)
        elif isinstance(arg1, tuple) and len(arg1) == 3:
            data, indices, indptr = (_dense(x, w) for x, w in zip(arg1, ("data", "indices", "indptr")))
            if not (data.ndim == indices.ndim == indptr.ndim == 1):
                raise ValueError("data, indices, and indptr should be 1-D")
            if len(data) != len(indices):
                raise ValueError("indices and data should have the same size")
            for a, w in ((indices, "indices"), (indptr, "indptr")):
                if a.dtype.kind not in "iu":
                    raise ValueError(f"{w} must be an integer array; got {a.dtype}")
            dtype = np.dtype(dtype) if dtype is not None else data.dtype
            if dtype.char not in _DATA_CHARS:
                raise ValueError("Only bool, float32, float64, complex64 and complex128 are supported")
            cls = _sp.csr_matrix if self.format == "csr" else _sp.csc_matrix
            self._m = cls((data.astype(dtype, copy=copy), indices, indptr), shape=shape, copy=copy)
        else:
            raise ValueError("Unsupported initializer format (the stand-in takes (data, indices, indptr) or a "
                             "sparse matrix)")

    @classmethod
    def _of(cls, m):
        obj = cls.__new__(cls)
        obj._m = m
        return obj

    shape = property(lambda self: self._m.shape)
    dtype = property(lambda self: self._m.dtype)
    nnz = property(lambda self: self._m.nnz)
    ndim = 2
    data = property(lambda self: ndarray._from_numpy(self._m.data))
    indices = property(lambda self: ndarray._from_numpy(self._m.indices))
    indptr = property(lambda self: ndarray._from_numpy(self._m.indptr))

    @property
    def T(self):
        t = self._m.T
        return (csc_matrix if t.format == "csc" else csr_matrix)._of(t)

    def transpose(self):
        return self.T

    def get(self, stream=None):
        _capture.refuse_readback("a sparse matrix's get()")
        return self._m.copy()

    def toarray(self, order=None, out=None):
        _capture.refuse_allocation("a sparse matrix's toarray()")
        return ndarray._from_numpy(self._m.toarray(order=order))

    def tocsr(self, copy=False):
        return csr_matrix._of(self._m.tocsr(copy=copy))

    def tocsc(self, copy=False):
        return csc_matrix._of(self._m.tocsc(copy=copy))

    def _product(self, other, left: bool):
        _capture.refuse_library("cuSPARSE", "a sparse matrix product")
        if isinstance(other, _Compressed):
            m = self._m @ other._m if left else other._m @ self._m
            return (csr_matrix if m.format == "csr" else csc_matrix)._of(m.tocsr() if m.format not in ("csr", "csc")
                                                                          else m)
        if isinstance(other, np.ndarray):
            raise TypeError(f"Unsupported type {type(other)}: cupyx.scipy.sparse multiplies device arrays only")
        if not isinstance(other, ndarray):
            return NotImplemented
        if other.ndim not in (1, 2):
            raise ValueError("could not interpret dimensions")
        if self.dtype != other.dtype and self.dtype.char in "fd" and other.dtype.char in "fd":
            pass  # cuSPARSE works in the promoted type, as SciPy does
        result = self._m @ other._a if left else other._a @ self._m
        return ndarray._from_numpy(np.asarray(result))

    def __matmul__(self, other):
        return self._product(other, left=True)

    def __rmatmul__(self, other):
        return self._product(other, left=False)

    def dot(self, other):
        return self._product(other, left=True)

    def __mul__(self, other):
        if np.isscalar(other):
            _capture.refuse_library("cuSPARSE", "a sparse matrix times a scalar")
            return type(self)._of(self._m * other)
        return self._product(other, left=True)

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
                        "NumPy array explicitly.")

    def sum(self, axis=None, dtype=None, out=None):
        _capture.refuse_allocation("a sparse matrix's sum()")
        r = self._m.sum(axis=axis, dtype=dtype)
        return ndarray._from_numpy(np.asarray(r))


class csr_matrix(_Compressed):
    format = "csr"


class csc_matrix(_Compressed):
    format = "csc"


def issparse(x) -> bool:
    return isinstance(x, _Compressed)


isspmatrix = issparse


def isspmatrix_csr(x) -> bool:
    return isinstance(x, csr_matrix)


def isspmatrix_csc(x) -> bool:
    return isinstance(x, csc_matrix)
