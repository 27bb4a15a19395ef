"""CPU kernels of the sparse fine-tuning step (:mod:`ksae_cupy.supervised.sparse_finetune`), compiled with Numba.

A layer maps ``I`` input units to ``M`` output units through ``W_im``, stored with one
contiguous row per input unit. Each of the ``N`` examples keeps ``k`` input units
(``idx_nk`` int32, values ``val_nk``) and, where the layer's output is sparse too, ``t``
output units (``idx_nt``, ``val_nt``). The softmax layer is one whose output keeps all its
``C`` classes. The loops:

* :func:`sparse_rows_product`: ``Zs W + b`` for a sparse ``Zs``: per example, ``b`` plus the
  sum of its kept rows of ``W``;
* :func:`kept_row_dots`: ``(dZ W^T)`` at the kept inputs only: per kept input, a dot product of
  its row of ``W`` with the example's sparse ``dZ``;
* weight gradients as scatters of rows, built (:func:`dense_rows_gradient`,
  :func:`sparse_rows_gradient`) or applied row by row inside the momentum update
  (:func:`momentum_update_dense_rows`, :func:`momentum_update_sparse_rows`), which still
  updates every entry: the velocity decays everywhere.

Same rules as :mod:`ksae_cupy.cpu.numba_kernels`, whose compilation (``_kernel``, ``_compiled``,
``cache=True``) and counting sort of the kept pairs by unit (``_pairs_by_unit``) these share:
parallel loops over examples or over blocks of whole rows, so each output element is computed by
one thread in one order, and results are bit for bit those of one thread.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.cpu import numba_kernels  # its _flushed, read as compiled when a kernel here is
from ksae_cupy.cpu.numba_kernels import _UNITS_PER_BLOCK, _compiled, _helper, _kernel, _pairs_by_unit, smallest_normal

prange = range  # numba.prange once the first kernel here is compiled (set by _compiled)


@_kernel(fastmath={"contract"})
def _sparse_rows_product(idx_nk, val_nk, W_im, b_m, Z_nm):
    N, k = idx_nk.shape
    M = W_im.shape[1]
    for n in prange(N):  # one thread owns a row of Z
        z = Z_nm[n]
        for m in range(M):
            z[m] = 0
        for j in range(k):
            w = W_im[idx_nk[n, j]]
            v = val_nk[n, j]
            for m in range(M):
                z[m] += v * w[m]
        for m in range(M):  # the bias last, as the dense ``A W + b`` adds it
            z[m] += b_m[m]


def sparse_rows_product(idx_nk, val_nk, W_im, b_m):
    """``Z_nm = Zs W_im + b_m`` where row n of ``Zs`` holds ``val_nk[n]`` at ``idx_nk[n]``: N k M multiply-adds."""
    Z_nm = np.empty((idx_nk.shape[0], W_im.shape[1]), dtype=W_im.dtype)
    _compiled(_sparse_rows_product)(idx_nk, val_nk, np.ascontiguousarray(W_im), b_m, Z_nm)
    return Z_nm


# Reassociation lets the dot products vectorise; it changes the order of one sum, never its
# terms, and the order does not depend on the thread count.
@_kernel(fastmath={"reassoc", "contract"})
def _kept_row_dots(idx_nk, W_im, idx_nt, val_nt, zero, out_nk):
    N, k = idx_nk.shape
    t_kept = idx_nt.shape[1]
    for n in prange(N):
        for j in range(k):
            w = W_im[idx_nk[n, j]]
            acc = zero  # in the arrays' own float type
            for t in range(t_kept):
                acc += w[idx_nt[n, t]] * val_nt[n, t]
            out_nk[n, j] = acc


def kept_row_dots(idx_nk, W_im, idx_nt, val_nt):
    """``out_nk[n, j] = sum_t W_im[idx_nk[n, j], idx_nt[n, t]] val_nt[n, t]``: the product ``dZ W^T``
    at the kept inputs only, with ``dZ`` sparse (``idx_nt``, ``val_nt``). N k t multiply-adds."""
    out_nk = np.empty(idx_nk.shape, dtype=W_im.dtype)
    _compiled(_kept_row_dots)(idx_nk, np.ascontiguousarray(W_im), idx_nt, val_nt, W_im.dtype.type(0), out_nk)
    return out_nk


# -- weight gradients as scatters of rows ------------------------------------------------------
#
# Row i of the gradient is a sum over the (example n, slot j) pairs that kept unit i, in example
# order (``_pairs_by_unit``); one thread owns a block of whole rows.

@_helper
def _dense_rows_gradient_row(g, i, coef_nk, B_nm, start_i, pair_n, pair_j):
    """Row ``i`` into ``g``: the sum of ``coef_nk[n, j] B_nm[n]`` over the pairs that kept unit ``i``."""
    M = g.shape[0]
    for m in range(M):
        g[m] = 0
    for p in range(start_i[i], start_i[i + 1]):
        n = pair_n[p]
        a = coef_nk[n, pair_j[p]]
        b = B_nm[n]
        for m in range(M):
            g[m] += a * b[m]


@_helper
def _sparse_rows_gradient_row(g, i, coef_nk, idx_nt, val_nt, start_i, pair_n, pair_j):
    """Row ``i`` into ``g``: the sum of ``coef_nk[n, j]`` times the sparse row ``(idx_nt[n], val_nt[n])``
    over the pairs that kept unit ``i``."""
    M = g.shape[0]
    for m in range(M):
        g[m] = 0
    for p in range(start_i[i], start_i[i + 1]):
        n = pair_n[p]
        a = coef_nk[n, pair_j[p]]
        for t in range(idx_nt.shape[1]):
            g[idx_nt[n, t]] += a * val_nt[n, t]


@_helper
def _momentum_row(w, v, g, momentum, lr, tiny):
    """``v <- m v - lr g; w <- w + v`` on one row, denormals flushed to zero (``numba_kernels._flushed``)."""
    for m in range(w.shape[0]):
        step = v[m] * momentum
        step = numba_kernels._flushed(step - lr * g[m], tiny)
        v[m] = step
        w[m] = numba_kernels._flushed(w[m] + step, tiny)


@_kernel(fastmath={"contract"})
def _dense_rows_gradient(coef_nk, B_nm, start_i, pair_n, pair_j, dW_im):
    rows = dW_im.shape[0]
    for block in prange((rows + _UNITS_PER_BLOCK - 1) // _UNITS_PER_BLOCK):
        for i in range(block * _UNITS_PER_BLOCK, min(rows, (block + 1) * _UNITS_PER_BLOCK)):
            _dense_rows_gradient_row(dW_im[i], i, coef_nk, B_nm, start_i, pair_n, pair_j)


@_kernel(fastmath={"contract"})
def _sparse_rows_gradient(coef_nk, idx_nt, val_nt, start_i, pair_n, pair_j, dW_im):
    rows = dW_im.shape[0]
    for block in prange((rows + _UNITS_PER_BLOCK - 1) // _UNITS_PER_BLOCK):
        for i in range(block * _UNITS_PER_BLOCK, min(rows, (block + 1) * _UNITS_PER_BLOCK)):
            _sparse_rows_gradient_row(dW_im[i], i, coef_nk, idx_nt, val_nt, start_i, pair_n, pair_j)


@_kernel(fastmath={"contract"})
def _momentum_update_dense_rows(W_im, V_im, coef_nk, B_nm, start_i, pair_n, pair_j, momentum, lr, tiny):
    rows, M = W_im.shape
    for block in prange((rows + _UNITS_PER_BLOCK - 1) // _UNITS_PER_BLOCK):
        g = np.empty(M, dtype=W_im.dtype)  # this thread's gradient row, kept in cache
        for i in range(block * _UNITS_PER_BLOCK, min(rows, (block + 1) * _UNITS_PER_BLOCK)):
            _dense_rows_gradient_row(g, i, coef_nk, B_nm, start_i, pair_n, pair_j)
            _momentum_row(W_im[i], V_im[i], g, momentum, lr, tiny)


@_kernel(fastmath={"contract"})
def _momentum_update_sparse_rows(W_im, V_im, coef_nk, idx_nt, val_nt, start_i, pair_n, pair_j, momentum, lr, tiny):
    rows, M = W_im.shape
    for block in prange((rows + _UNITS_PER_BLOCK - 1) // _UNITS_PER_BLOCK):
        g = np.empty(M, dtype=W_im.dtype)
        for i in range(block * _UNITS_PER_BLOCK, min(rows, (block + 1) * _UNITS_PER_BLOCK)):
            _sparse_rows_gradient_row(g, i, coef_nk, idx_nt, val_nt, start_i, pair_n, pair_j)
            _momentum_row(W_im[i], V_im[i], g, momentum, lr, tiny)


def dense_rows_gradient(idx_nk, coef_nk, B_nm, rows: int):
    """``dW_im = Zs^T B`` with ``Zs`` sparse (``coef_nk`` at ``idx_nk``) and ``B_nm`` dense: row i is
    the sum of ``coef_nk[n, j] B_nm[n]`` over the pairs with ``idx_nk[n, j] = i``; rows no example
    kept stay zero. N k M multiply-adds."""
    dW_im = np.empty((rows, B_nm.shape[1]), dtype=B_nm.dtype)
    start_i, pair_n, pair_j = _compiled(_pairs_by_unit)(idx_nk, rows)
    _compiled(_dense_rows_gradient)(coef_nk, np.ascontiguousarray(B_nm), start_i, pair_n, pair_j, dW_im)
    return dW_im


def sparse_rows_gradient(idx_nk, coef_nk, idx_nt, val_nt, shape):
    """``dW_im = Zs^T Ys`` with both factors sparse (``coef_nk`` at ``idx_nk``; ``val_nt`` at ``idx_nt``):
    entry ``(idx_nk[n, j], idx_nt[n, t])`` gets ``coef_nk[n, j] val_nt[n, t]``. N k t multiply-adds
    (and ``shape`` zeros)."""
    dW_im = np.empty(shape, dtype=val_nt.dtype)
    start_i, pair_n, pair_j = _compiled(_pairs_by_unit)(idx_nk, shape[0])
    _compiled(_sparse_rows_gradient)(coef_nk, idx_nt, val_nt, start_i, pair_n, pair_j, dW_im)
    return dW_im


def momentum_update_dense_rows(W_im, V_im, idx_nk, coef_nk, B_nm, momentum: float, lr: float) -> None:
    """The momentum update of every entry of ``W_im`` (velocity ``V_im``) by the gradient
    :func:`dense_rows_gradient` would build, without building it: one pass over the rows of ``W``
    and ``V``, each gradient row summed in a buffer that stays in cache. In place; both C-contiguous."""
    scalar = W_im.dtype.type
    start_i, pair_n, pair_j = _compiled(_pairs_by_unit)(idx_nk, W_im.shape[0])
    _compiled(_momentum_update_dense_rows)(W_im, V_im, coef_nk, np.ascontiguousarray(B_nm), start_i, pair_n, pair_j,
                                           scalar(momentum), scalar(lr), smallest_normal(W_im.dtype))


def momentum_update_sparse_rows(W_im, V_im, idx_nk, coef_nk, idx_nt, val_nt, momentum: float, lr: float) -> None:
    """As :func:`momentum_update_dense_rows`, by the gradient :func:`sparse_rows_gradient` would build."""
    scalar = W_im.dtype.type
    start_i, pair_n, pair_j = _compiled(_pairs_by_unit)(idx_nk, W_im.shape[0])
    _compiled(_momentum_update_sparse_rows)(W_im, V_im, coef_nk, idx_nt, val_nt, start_i, pair_n, pair_j,
                                            scalar(momentum), scalar(lr), smallest_normal(W_im.dtype))
