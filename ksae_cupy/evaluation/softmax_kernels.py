"""The softmax classifier's two sparse products on the CPU, compiled with Numba.

The features ``ksae-eval`` fits keep the same number of units in every row (alpha*k), so their CSR
matrix is a fixed-width layout in disguise: its ``indices`` and ``data`` reshaped to ``(N, K)`` are
each row's units ``idx_nk`` and values ``val_nk`` (:func:`fixed_width_rows`). On them:

    L_cn[c, n]  = sum_j val_nk[n, j] W_hc[idx_nk[n, j], c] + b_c[c]     (gather_logits: X W + b)
    dW_hc[h, c] = sum over (n, j) with idx_nk[n, j] = h of val_nk[n, j] G_cn[c, n]
                                                                          (scatter_gradient: X^T G)

Why compiled loops: SciPy's product keeps a row's C sums in memory from one entry to the next
(about 3.5 ns per entry for 10 classes here), and it was four fifths of ``ksae-eval``'s time. The loops
below hold them in C named variables, one per class, which LLVM's SLP vectorizer packs into vector
registers: at 50,000 rows x 100 units and 10 classes, 5.0 ms against SciPy's 17.3 ms for ``X W``
and 6.3 ms against 13.8 ms for ``X^T G`` (one thread). Each sum is added up in SciPy's
order with no fused multiply-add, so the results are SciPy's, bit for bit (tested).

Why generated source: the variables are one per class, so the loops (``_GATHER``, ``_SCATTER``) are
written out for one class count at a time (:func:`_source`), compiled on first use for that count
(about 1 s) and cached on disk as the package's other kernels are. Numba builds with the SLP
vectorizer off (``NUMBA_SLP_VECTORIZE=0``); it is switched on while these kernels compile, and only
then (without it the loops stay scalar: 11 ms and 16 ms above).

Numba is optional: :func:`available` says whether these run (it also honours ``KSAE_CPU_KERNELS=0``);
the classifier keeps its SciPy products otherwise.
"""
from __future__ import annotations

import threading

import numpy as np

_GATHER = '''
def gather_logits_{n_classes}(idx_nk, val_nk, W_hc, b_c, L_cn):
    for n in range(idx_nk.shape[0]):
        {zero_each} = W_hc.dtype.type(0)
        for j in range(idx_nk.shape[1]):
            v = val_nk[n, j]
            w_c = W_hc[idx_nk[n, j]]
{accumulate}
{store}
'''
_SCATTER = '''
def scatter_gradient_{n_classes}(idx_nk, val_nk, G_cn, dW_hc):
    dW_hc[:] = 0
    for n in range(idx_nk.shape[0]):
{load}
        for j in range(idx_nk.shape[1]):
            v = val_nk[n, j]
            d_c = dW_hc[idx_nk[n, j]]
{scatter}
'''


def _source(n_classes: int) -> str:
    """The two kernels' source for ``n_classes`` classes, named with the count (``gather_logits_10``): class
    ``c``'s sum is the variable ``s{c}`` (its gradient entry ``g{c}``)."""
    classes = range(n_classes)
    gather = _GATHER.format(
        n_classes=n_classes, zero_each=" = ".join(f"s{c}" for c in classes),
        accumulate="\n".join(f"            s{c} += v * w_c[{c}]" for c in classes),
        store="\n".join(f"        L_cn[{c}, n] = s{c} + b_c[{c}]" for c in classes))
    scatter = _SCATTER.format(
        n_classes=n_classes, load="\n".join(f"        g{c} = G_cn[{c}, n]" for c in classes),
        scatter="\n".join(f"            d_c[{c}] += v * g{c}" for c in classes))
    return gather + scatter


def available() -> bool:
    """Whether the kernels run: Numba is installed and ``KSAE_CPU_KERNELS`` is not ``0``."""
    from ksae_cupy.cpu import numba_kernels

    return numba_kernels.enabled()


def fixed_width_rows(X_nh):
    """``(idx_nk, val_nk)``: views of a CSR matrix whose rows all hold ``K`` entries (``K >= 1``), else
    None (any other matrix or array, which the SciPy/NumPy products serve)."""
    import scipy.sparse as sp

    if not sp.issparse(X_nh) or X_nh.format != "csr" or X_nh.shape[0] == 0:
        return None
    N, indptr = X_nh.shape[0], X_nh.indptr
    K = int(indptr[1] - indptr[0])
    if K == 0 or indptr[-1] != N * K or not np.array_equal(indptr, np.arange(0, N * K + 1, K)):
        return None
    return X_nh.indices.reshape(N, K), X_nh.data.reshape(N, K)


def gather_logits(idx_nk, val_nk, W_hc, b_c):
    """``L_cn``: ``(X W + b)^T`` of the rows ``(idx_nk, val_nk)``, class-major (the softmax reduces along ``n``)."""
    C = W_hc.shape[1]
    L_cn = np.empty((C, idx_nk.shape[0]), dtype=W_hc.dtype)
    _run("gather_logits", C, idx_nk, val_nk, np.ascontiguousarray(W_hc), np.ascontiguousarray(b_c), L_cn)
    return L_cn


def weight_gradient(idx_nk, val_nk, G_cn, H: int):
    """``dW_hc = X^T G`` for ``H`` units: ``G_cn`` (class-major) summed into the rows of each example's units."""
    dW_hc = np.empty((H, G_cn.shape[0]), dtype=G_cn.dtype)
    _run("scatter_gradient", G_cn.shape[0], idx_nk, val_nk, np.ascontiguousarray(G_cn), dW_hc)
    return dW_hc


_dispatchers: dict = {}  # n_classes -> {kernel name: its Numba dispatcher}
_compiled: set = set()  # (kernel name, n_classes, the arguments' dtypes) compiled (or loaded from the disk cache)
_compile_lock = threading.Lock()  # one compilation at a time (fits run in threads; the SLP switch is global)


def _run(name: str, n_classes: int, *arrays) -> None:
    """Call kernel ``name`` for ``n_classes`` on C-contiguous ``arrays``, compiled first for their dtypes
    with the SLP vectorizer on (the key is made of dtypes: Numba's own typing of the arguments, which
    every call makes again, cost as much as a small kernel)."""
    key = (name, n_classes, *(a.dtype.char for a in arrays))
    kernel = _kernels(n_classes)[name]
    if key not in _compiled:
        import numba

        with _compile_lock:
            slp = numba.config.SLP_VECTORIZE
            numba.config.SLP_VECTORIZE = 1
            try:
                kernel.compile(tuple(numba.typeof(a) for a in arrays))
            finally:
                numba.config.SLP_VECTORIZE = slp
            _compiled.add(key)
    kernel(*arrays)


def _kernels(n_classes: int) -> dict:
    """The dispatchers of :func:`_source`'s kernels for ``n_classes`` (made once; compiled per argument types)."""
    with _compile_lock:
        if n_classes not in _dispatchers:
            import numba

            namespace: dict = {}
            # Compiled as if from this file: Numba's disk cache keys a kernel on its file (and the file's
            # date), its name and its bytecode, and keeps no kernel of code that has no file.
            exec(compile(_source(n_classes), __file__, "exec"), {"__name__": __name__}, namespace)
            # nogil: fits of several alphas run side by side in threads; no fastmath: SciPy's sums, exactly
            _dispatchers[n_classes] = {name.rsplit("_", 1)[0]: numba.njit(nogil=True, cache=True)(fn)
                                       for name, fn in namespace.items()}
        return _dispatchers[n_classes]
