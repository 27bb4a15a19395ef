"""CPU kernels for the sparse step and the momentum update, compiled with Numba.

Each kernel is a plain loop that NumPy would have to spell as several passes with
temporaries. Shapes follow the package's names: ``W_hd`` is the weight matrix stored with
one contiguous row per hidden unit (the ``W_dh.T`` view of a Fortran-ordered ``W_dh``),
``idx_nk``/``val_nk`` the kept units of each row and their values.

Numba is optional (``pip install 'ksae-cupy[fast]'``). :func:`available` says whether the
kernels run; callers keep a NumPy/SciPy path for when they do not. Kernels are compiled
on first use, once per dtype, and cached on disk (``cache=True``) so later runs start at once.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np



@functools.cache  # asked on every step (optimizer, sparse step); the answer cannot change in a process
def available() -> bool:
    """Whether Numba is installed, so the kernels below can run (found without importing it)."""
    return importlib.util.find_spec("numba") is not None


def enabled() -> bool:
    """Whether NumPy steps and updates use these kernels: Numba is installed, and the environment
    does not set ``KSAE_CPU_KERNELS=0`` (which keeps the NumPy/SciPy paths, to time or test them)."""
    return os.environ.get("KSAE_CPU_KERNELS", "1") != "0" and available()


_FASTMATH = {}  # kernel -> the fastmath flags it is compiled with
_COMPILED = {}  # kernel -> its Numba dispatcher, made on first use (importing Numba takes ~0.5 s)


def _kernel(fastmath=False):
    """Mark a loop as a kernel, compiled with ``numba.njit(cache=True)`` when first called."""
    def mark(fn):
        _FASTMATH[fn] = fastmath
        return fn
    return mark


def _compiled(fn):
    if fn not in _COMPILED:
        import numba

        _COMPILED[fn] = numba.njit(cache=True, fastmath=_FASTMATH[fn])(fn)
    return _COMPILED[fn]


# Reassociation lets the compiler vectorise the dot products (and sums) below; it changes
# only the order of a sum, i.e. float rounding, never which terms are added.
@_kernel(fastmath={"reassoc", "contract"})
def _decode_and_backprop(W_hd, c_d, X_nd, idx_nk, val_nk, relu, batch, R_nd, dZ_nk):
    N, k = idx_nk.shape
    D = X_nd.shape[1]
    squared_error = 0.0  # float64 across rows
    zero = batch - batch  # 0 in the arrays' float type (batch is N in it)
    for n in range(N):
        r = R_nd[n]
        x = X_nd[n]
        for d in range(D):
            r[d] = c_d[d] - x[d]
        # Decoder: Xhat_n - X_n = c - X_n + sum over kept units of val * (row of W).
        for j in range(k):
            w = W_hd[idx_nk[n, j]]
            v = val_nk[n, j]
            for d in range(D):
                r[d] += v * w[d]
        row_error = zero
        for d in range(D):
            row_error += r[d] * r[d]
        squared_error += row_error
        for d in range(D):
            r[d] /= batch
        # The gradient at the kept units: R_n . (row of W), while those rows are still in cache.
        for j in range(k):
            if relu and not val_nk[n, j] > 0:  # a kept unit clipped to zero passes no gradient
                dZ_nk[n, j] = 0
                continue
            w = W_hd[idx_nk[n, j]]
            acc = zero  # accumulate in the arrays' own float type, so the loop vectorises
            for d in range(D):
                acc += w[d] * r[d]
            dZ_nk[n, j] = acc
    return 0.5 * squared_error / N


def decode_and_backprop(W_hd, c_d, X_nd, idx_nk, val_nk, relu: bool):
    """``(loss, R_nd, dZ_nk)`` from the kept units, reading each kept row of ``W_hd`` twice.

    ``R_nd = (Xhat_nd - X_nd) / N`` with ``Xhat_nd = Zs W_hd + c_d``; ``loss = 0.5 / N * sum
    (Xhat - X)^2``; ``dZ_nk[n, j] = R_n . W_hd[idx_nk[n, j]]``, zero where ``relu`` clipped
    the unit. ``N k D`` multiply-adds each for the decoder and for ``dZ``.
    """
    N, D = X_nd.shape
    R_nd = np.empty((N, D), dtype=X_nd.dtype)
    dZ_nk = np.empty(idx_nk.shape, dtype=X_nd.dtype)
    loss = _compiled(_decode_and_backprop)(W_hd, c_d, np.ascontiguousarray(X_nd), idx_nk, val_nk, bool(relu),
                                               X_nd.dtype.type(N), R_nd, dZ_nk)
    return float(loss), R_nd, dZ_nk


@_kernel(fastmath={"contract"})
def _scatter_weight_gradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, dW_hd):
    N, k = idx_nk.shape
    D = X_nd.shape[1]
    for h in range(dW_hd.shape[0]):
        for d in range(D):
            dW_hd[h, d] = 0
    for n in range(N):
        for j in range(k):
            g = dW_hd[idx_nk[n, j]]
            a = dZ_nk[n, j]
            b = val_nk[n, j]
            x = X_nd[n]
            r = R_nd[n]
            for d in range(D):
                g[d] += a * x[d] + b * r[d]


def weight_gradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, H: int):
    """``dW_hd = dZ^T X + Zs^T R`` as a scatter of rows: unit ``idx_nk[n, j]`` gets
    ``dZ_nk[n, j] X_n + val_nk[n, j] R_n``. ``2 N k D`` multiply-adds; rows of units no row
    kept stay zero."""
    dW_hd = np.empty((H, X_nd.shape[1]), dtype=X_nd.dtype)
    _compiled(_scatter_weight_gradient)(np.ascontiguousarray(X_nd), R_nd, idx_nk, dZ_nk, val_nk, dW_hd)
    return dW_hd


# No fastmath here: ``m v - lr g`` then ``theta + v``, each rounded as NumPy rounds them, so
# this update is bit for bit the NumPy one (tests/cpu/test_kernels.py checks it).
@_kernel()
def _momentum_update(theta, velocity, grad, momentum, lr):
    for i in range(theta.shape[0]):
        v = velocity[i] * momentum
        v = v - lr * grad[i]
        velocity[i] = v
        theta[i] += v


def _flat_view(a):
    """A 1-D view of ``a`` in memory order, or None when ``a`` is not one contiguous block."""
    if a.flags.c_contiguous:
        return a.reshape(-1)
    if a.flags.f_contiguous:
        return a.T.reshape(-1)
    return None


def momentum_update(theta, velocity, grad, momentum: float, lr: float) -> bool:
    """``v <- m v - lr g; theta <- theta + v`` in one pass, in place; False (nothing done)
    when the three arrays do not share one contiguous memory layout and dtype."""
    flat = [_flat_view(a) for a in (theta, velocity, grad)]
    same_layout = theta.strides == velocity.strides == grad.strides
    if any(f is None for f in flat) or not same_layout or not theta.dtype == velocity.dtype == grad.dtype:
        return False
    scalar = theta.dtype.type
    _compiled(_momentum_update)(flat[0], flat[1], flat[2], scalar(momentum), scalar(lr))
    return True



@_kernel(fastmath={"contract"})
def _momentum_update_rows(W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk, momentum, lr):
    N, k = idx_nk.shape
    H, D = W_hd.shape
    # Counting sort of the kept (row, unit) pairs by unit: rows of one unit in increasing order,
    # the order in which the row-by-row scatter of _scatter_weight_gradient adds them.
    start_h = np.zeros(H + 1, dtype=np.int64)
    for n in range(N):
        for j in range(k):
            start_h[idx_nk[n, j] + 1] += 1
    for h in range(H):
        start_h[h + 1] += start_h[h]
    fill_h = start_h[:H].copy()
    pair_n = np.empty(N * k, dtype=np.int64)
    pair_j = np.empty(N * k, dtype=np.int64)
    for n in range(N):
        for j in range(k):
            h = idx_nk[n, j]
            pair_n[fill_h[h]] = n
            pair_j[fill_h[h]] = j
            fill_h[h] += 1
    g = np.empty(D, dtype=W_hd.dtype)
    for h in range(H):
        w = W_hd[h]
        v = V_hd[h]
        for d in range(D):
            g[d] = 0
        for p in range(start_h[h], start_h[h + 1]):
            n = pair_n[p]
            a = dZ_nk[n, pair_j[p]]
            b = val_nk[n, pair_j[p]]
            x = X_nd[n]
            r = R_nd[n]
            for d in range(D):
                g[d] += a * x[d] + b * r[d]
        for d in range(D):
            step = v[d] * momentum
            step = step - lr * g[d]
            v[d] = step
            w[d] += step


def momentum_update_rows(W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk, momentum: float, lr: float) -> None:
    """The momentum update of ``W_hd`` (velocity ``V_hd``) by the gradient
    :func:`weight_gradient` would build, without building it: one pass over the rows of ``W``
    and ``V``, each unit's gradient row summed in a buffer that stays in cache. In place; the
    same arithmetic as :func:`weight_gradient` followed by :func:`momentum_update`."""
    scalar = W_hd.dtype.type
    _compiled(_momentum_update_rows)(W_hd, V_hd, np.ascontiguousarray(X_nd), R_nd, idx_nk, dZ_nk, val_nk,
                                     scalar(momentum), scalar(lr))

