"""CPU kernel of the AuxK step (issue 35, beyond the paper): one momentum update of ``W`` by two row scatters.

With the auxiliary loss on (:mod:`ksae_cupy.auxk_step`), ``dW_hd`` has two parts of the same form
as the sparse step's (:class:`ksae_cupy.sparse_step.RowScatterGradient`): unit ``idx_nk[n, j]`` gets
``dZ_nk[n, j] X_n + val_nk[n, j] R_n`` from the main loss, and unit ``idx_na[n, j]`` gets
``dZa_na[n, j] X_n + vala_na[n, j] Ra_nd[n]`` from the auxiliary one. Momentum SGD must see their
sum (``v <- m v - lr (g + ga)``), so this kernel sums both rows of each unit in a cache-resident
buffer and updates ``W`` and ``V`` in one pass, as :func:`ksae_cupy.cpu.kernels.momentum_update_rows`
does for one part. It uses that module's compilation (``_kernel``/``_compiled``, Numba, cached on
disk) and its counting sort of pairs by unit; the kernels there are left as they are.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.cpu import kernels as cpu_kernels

prange = range  # numba.prange once compiled (set by cpu_kernels._compiled in this module's globals)

_UNITS_PER_BLOCK = 8  # whole units per parallel piece: one thread owns a unit's rows of W and V


@cpu_kernels._kernel(fastmath={"contract"})
def _momentum_update_two_scatters(W_hd, V_hd, X_nd, R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j,
                                  Ra_nd, dZa_na, vala_na, starta_h, paira_n, paira_j, momentum, lr):
    H, D = W_hd.shape
    for block in prange((H + _UNITS_PER_BLOCK - 1) // _UNITS_PER_BLOCK):
        g = np.empty(D, dtype=W_hd.dtype)  # this thread's gradient row, kept in cache
        for h in range(block * _UNITS_PER_BLOCK, min(H, (block + 1) * _UNITS_PER_BLOCK)):
            for d in range(D):
                g[d] = 0
            for p in range(start_h[h], start_h[h + 1]):  # the main loss's pairs, in example order
                n = pair_n[p]
                a = dZ_nk[n, pair_j[p]]
                b = val_nk[n, pair_j[p]]
                for d in range(D):
                    g[d] += a * X_nd[n, d] + b * R_nd[n, d]
            for p in range(starta_h[h], starta_h[h + 1]):  # then the auxiliary loss's
                n = paira_n[p]
                a = dZa_na[n, paira_j[p]]
                b = vala_na[n, paira_j[p]]
                for d in range(D):
                    g[d] += a * X_nd[n, d] + b * Ra_nd[n, d]
            w = W_hd[h]
            v = V_hd[h]
            for d in range(D):
                step = v[d] * momentum
                step = step - lr * g[d]
                v[d] = step
                w[d] += step


def momentum_update_two_scatters(W_hd, V_hd, X_nd, main: tuple, aux: tuple, momentum: float, lr: float) -> None:
    """``v <- m v - lr (dW_main + dW_aux); W <- W + v`` in place, row by row, never building ``dW``.

    ``main`` is ``(R_nd, idx_nk, dZ_nk, val_nk)``, ``aux`` is ``(Ra_nd, idx_na, dZa_na, vala_na)``."""
    scalar = W_hd.dtype.type
    H = W_hd.shape[0]
    R_nd, idx_nk, dZ_nk, val_nk = main
    Ra_nd, idx_na, dZa_na, vala_na = aux
    pairs = cpu_kernels._compiled(cpu_kernels._pairs_by_unit)
    start_h, pair_n, pair_j = pairs(idx_nk, H)
    starta_h, paira_n, paira_j = pairs(idx_na, H)
    cpu_kernels._compiled(_momentum_update_two_scatters)(
        W_hd, V_hd, np.ascontiguousarray(X_nd), R_nd, dZ_nk, val_nk, start_h, pair_n, pair_j,
        Ra_nd, dZa_na, vala_na, starta_h, paira_n, paira_j, scalar(momentum), scalar(lr))
