"""CPU kernels for the sparse step and the momentum update, compiled with Numba.

Each kernel is a plain loop that NumPy would have to spell as several passes with
temporaries. Shapes follow the package's names: ``W_hd`` is the weight matrix stored with
one contiguous row per hidden unit (the ``W_dh.T`` view of a Fortran-ordered ``W_dh``),
``idx_nk``/``val_nk`` the kept units of each row and their values.

Numba is optional (``pip install 'ksae-cupy[fast]'``). :func:`available` says whether the
kernels run; callers keep a NumPy/SciPy path for when they do not. Kernels are compiled
on first use, once per dtype, and cached on disk (``cache=True``) so later runs start at once.

Threads: the loops run in parallel (``numba.prange``) over independent pieces (examples, or
whole hidden units), so every output element is computed by one thread in the same order
whatever the thread count: results are bit for bit those of one thread (tested).
:func:`set_threads` (what ``--threads`` calls) sets the count.
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


_OPTIONS = {}  # kernel -> the numba.njit options it is compiled with
_COMPILED = {}  # kernel -> its Numba dispatcher, made on first use (importing Numba takes ~0.5 s)
_threads = None  # the count set_threads asked for (None: Numba's default, one per core)
# The kernels' parallel loops say ``prange``: plain ``range`` until Numba is imported, then
# ``numba.prange`` (set in _compiled, in the kernel's module, before a compilation reads it).
prange = range


def _kernel(fastmath=False, parallel=True):
    """Mark a loop as a kernel, compiled with ``numba.njit(cache=True)`` when first called."""
    def mark(fn):
        _OPTIONS[fn] = {"fastmath": fastmath, "parallel": parallel}
        return fn
    return mark


_HELPERS = []  # (module globals, name) of functions the kernels call: compiled, and rebound there, before any kernel


def _helper(fn):
    """Mark a function that kernels call; compiled inline into them (``numba.njit(inline="always")``).

    Kernels of other modules (:mod:`ksae_cupy.cpu.finetune_kernels`) mark theirs here too: the
    compiled helper is rebound in the module that defines it, where its kernels look it up."""
    _HELPERS.append((fn.__globals__, fn.__name__))
    return fn


def _compiled(fn):
    if fn not in _COMPILED:
        import numba

        fn.__globals__["prange"] = numba.prange  # read from the kernel's own module (here, or finetune_kernels)
        for module_globals, name in _HELPERS:  # a kernel reads its helpers' compiled versions when it is compiled
            if not hasattr(module_globals[name], "py_func"):
                module_globals[name] = numba.njit(inline="always", fastmath={"contract"})(module_globals[name])
        if "NUMBA_THREADING_LAYER" not in os.environ:
            # Numba's own thread pool. The OpenMP layer, between OpenBLAS calls on a 2-core machine,
            # made a step 10-20x slower (its threads and BLAS's spin-wait for the same cores);
            # workqueue threads sleep. It serves one calling thread at a time, as the trainer calls.
            numba.config.THREADING_LAYER = "workqueue"
        _apply_threads(numba)
        _COMPILED[fn] = numba.njit(cache=True, **_OPTIONS[fn])(fn)
    return _COMPILED[fn]


def _apply_threads(numba) -> None:
    if _threads is not None:
        numba.set_num_threads(min(_threads, numba.config.NUMBA_NUM_THREADS))


def set_threads(threads: int | None) -> None:
    """Run the kernels on ``threads`` threads (None: one per core, Numba's default).

    Capped at the threads Numba started with (``NUMBA_NUM_THREADS``, one per core). Applied at
    once if Numba is already imported, else when the first kernel is compiled.
    """
    global _threads
    _threads = threads
    import sys
    if "numba" in sys.modules and available():
        _apply_threads(sys.modules["numba"])


def threads() -> int:
    """The thread count the kernels run on now."""
    import sys
    if "numba" in sys.modules:
        return sys.modules["numba"].get_num_threads()
    return _threads if _threads is not None else (os.cpu_count() or 1)




# Reassociation lets the compiler vectorise the dot products (and sums) below; it changes
# only the order of a sum within one row, i.e. float rounding, never which terms are added,
# and the order is the same whatever the thread count.
@_kernel(fastmath={"reassoc", "contract"})
def _decode_and_backprop(W_hd, c_d, X_nd, idx_nk, val_nk, relu, batch, R_nd, dZ_nk, row_error_n):
    N, k = idx_nk.shape
    D = X_nd.shape[1]
    zero = batch - batch  # 0 in the arrays' float type (batch is N in it)
    for n in prange(N):  # examples are independent: one thread owns a row of R and of dZ
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
        row_error_n[n] = row_error
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


def _sum_in_order(row_error_n) -> float:
    """Sum of the per-example errors in example order, in float64: the same whatever the threads."""
    return float(sum(row_error_n.astype(np.float64).tolist()))


def decode_and_backprop(W_hd, c_d, X_nd, idx_nk, val_nk, relu: bool):
    """``(loss, R_nd, dZ_nk)`` from the kept units, reading each kept row of ``W_hd`` twice.

    ``R_nd = (Xhat_nd - X_nd) / N`` with ``Xhat_nd = Zs W_hd + c_d``; ``loss = 0.5 / N * sum
    (Xhat - X)^2``; ``dZ_nk[n, j] = R_n . W_hd[idx_nk[n, j]]``, zero where ``relu`` clipped
    the unit. ``N k D`` multiply-adds each for the decoder and for ``dZ``; parallel over examples.
    """
    N, D = X_nd.shape
    R_nd = np.empty((N, D), dtype=X_nd.dtype)
    dZ_nk = np.empty(idx_nk.shape, dtype=X_nd.dtype)
    row_error_n = np.empty(N, dtype=X_nd.dtype)
    _compiled(_decode_and_backprop)(W_hd, c_d, np.ascontiguousarray(X_nd), idx_nk, val_nk, bool(relu),
                                    X_nd.dtype.type(N), R_nd, dZ_nk, row_error_n)
    return 0.5 * _sum_in_order(row_error_n) / N, R_nd, dZ_nk


@_kernel(fastmath={"reassoc", "contract"})
def _reconstruction_errors(W_hd, c_d, X_nd, idx_nk, val_nk, row_error_n):
    N, k = idx_nk.shape
    D = X_nd.shape[1]
    for n in prange(N):
        r = c_d - X_nd[n]  # one row's buffer per example: allocation is small beside the N k D work
        for j in range(k):
            w = W_hd[idx_nk[n, j]]
            v = val_nk[n, j]
            for d in range(D):
                r[d] += v * w[d]
        row_error = r[0] - r[0]
        for d in range(D):
            row_error += r[d] * r[d]
        row_error_n[n] = row_error


def reconstruction_error(W_hd, c_d, X_nd, idx_nk, val_nk) -> float:
    """``sum_n ||Xhat_n - X_n||^2`` through the kept units only (the validation loss's sum), as a float."""
    row_error_n = np.empty(X_nd.shape[0], dtype=X_nd.dtype)
    _compiled(_reconstruction_errors)(W_hd, c_d, np.ascontiguousarray(X_nd), idx_nk, val_nk, row_error_n)
    return _sum_in_order(row_error_n)


@_kernel(parallel=False)  # N k steps: cheaper than starting threads
def _pairs_by_unit(idx_nk, H):
    """Counting sort of the kept (example, slot) pairs by unit: ``(start_h, pair_n, pair_j)``,
    unit h's pairs at ``start_h[h]:start_h[h + 1]``, in increasing example order."""
    N, k = idx_nk.shape
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
    return start_h, pair_n, pair_j


# Work is split over blocks of whole hidden units: one thread owns a unit's row of the
# gradient (and of W and its velocity), so no two threads write one element and each row's
# sum is in example order, as one thread would add it.
_UNITS_PER_BLOCK = 8


@_helper
def _gradient_row(g, h, X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j):
    """Unit ``h``'s row of ``dW_hd`` into ``g``: the sum, in example order, of ``dZ_nj X_n + val_nj R_n``."""
    D = g.shape[0]
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


@_kernel(fastmath={"contract"})
def _scatter_weight_gradient(X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j, dW_hd):
    H = dW_hd.shape[0]
    for block in prange((H + _UNITS_PER_BLOCK - 1) // _UNITS_PER_BLOCK):
        for h in range(block * _UNITS_PER_BLOCK, min(H, (block + 1) * _UNITS_PER_BLOCK)):
            _gradient_row(dW_hd[h], h, X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j)


def weight_gradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, H: int):
    """``dW_hd = dZ^T X + Zs^T R`` as a scatter of rows: unit ``idx_nk[n, j]`` gets
    ``dZ_nk[n, j] X_n + val_nk[n, j] R_n``. ``2 N k D`` multiply-adds; rows of units no row
    kept stay zero. Parallel over hidden units."""
    dW_hd = np.empty((H, X_nd.shape[1]), dtype=X_nd.dtype)
    start_h, pair_n, pair_j = _compiled(_pairs_by_unit)(idx_nk, H)
    _compiled(_scatter_weight_gradient)(np.ascontiguousarray(X_nd), R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j,
                                        dW_hd)
    return dW_hd


_CHUNK = 16384  # elements per parallel piece of the flat momentum update


# No fastmath here: ``m v - lr g`` then ``theta + v``, each rounded as NumPy rounds them, so
# this update is bit for bit the NumPy one (tests/cpu/test_kernels.py checks it).
@_kernel()
def _momentum_update(theta, velocity, grad, momentum, lr):
    size = theta.shape[0]
    for chunk in prange((size + _CHUNK - 1) // _CHUNK):
        for i in range(chunk * _CHUNK, min(size, (chunk + 1) * _CHUNK)):
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
def _momentum_update_rows(W_hd, V_hd, X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j, momentum, lr):
    H, D = W_hd.shape
    for block in prange((H + _UNITS_PER_BLOCK - 1) // _UNITS_PER_BLOCK):
        g = np.empty(D, dtype=W_hd.dtype)  # this thread's gradient row, kept in cache
        for h in range(block * _UNITS_PER_BLOCK, min(H, (block + 1) * _UNITS_PER_BLOCK)):
            w = W_hd[h]
            v = V_hd[h]
            _gradient_row(g, h, X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j)
            for d in range(D):
                step = v[d] * momentum
                step = step - lr * g[d]
                v[d] = step
                w[d] += step


def momentum_update_rows(W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk, momentum: float, lr: float) -> None:
    """The momentum update of ``W_hd`` (velocity ``V_hd``) by the gradient
    :func:`weight_gradient` would build, without building it: one pass over the rows of ``W``
    and ``V``, each unit's gradient row summed in a buffer that stays in cache. In place; the
    same arithmetic as :func:`weight_gradient` followed by :func:`momentum_update`. Parallel over
    hidden units."""
    scalar = W_hd.dtype.type
    start_h, pair_n, pair_j = _compiled(_pairs_by_unit)(idx_nk, W_hd.shape[0])
    _compiled(_momentum_update_rows)(W_hd, V_hd, np.ascontiguousarray(X_nd), R_nd, dZ_nk, val_nk,
                                     start_h, pair_n, pair_j, scalar(momentum), scalar(lr))
