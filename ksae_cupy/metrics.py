"""The sparse-autoencoder field's metrics of a model on a set of rows: FVE, L0 and dead units.

    FVE   fraction of variance explained: 1 - sum ||x - xhat||^2 / sum ||x - mean(x)||^2, the mean
          being the rows' own (scikit-learn's ``r2_score(multioutput="variance_weighted")``); 1 is
          a perfect reconstruction, 0 no better than the mean, below 0 worse
    L0    the mean count of non-zero units per row of a code: k for the k-code of linear units (fewer
          where a kept value is exactly 0, as ReLU units make them), about alpha*k for the features
    dead  the fraction of hidden units that no row kept (non-zero in the k-code); the training's
          ``dead`` counts the same over an epoch's examples

Everything here is written against the array module of its inputs (NumPy or CuPy) and sums in
float64; :func:`reconstruction_metrics` walks the rows in chunks, so a (chunk, H) code is the one
temporary.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.backend import CPU, array_module, to_host
from ksae_cupy.model import alpha_k, hidden_preactivations, select_units
from ksae_cupy.topk import scatter_rows


def fve_from_sums(squared_error: float, total_variance: float) -> float:
    """``1 - squared_error / total_variance``; a constant set of rows (no variance) scores 1 when it is
    reconstructed exactly and 0 otherwise, as scikit-learn's ``r2_score`` does. A NaN in either sum (a NaN in
    the rows or their reconstructions) is NaN, never a confident 0 or 1."""
    if np.isnan(squared_error) or np.isnan(total_variance):
        return float("nan")
    if total_variance > 0:
        return 1.0 - float(squared_error) / float(total_variance)
    return 1.0 if squared_error == 0 else 0.0


def total_variance(X_nd, chunk: int = 8192) -> float:
    """``sum ||x - mean(x)||^2`` over the rows, in float64, chunk by chunk (Chan et al.'s pairwise
    update: no ``sum x^2 - N mean^2`` cancellation on data far from 0)."""
    return _VarianceSum.of(X_nd, chunk).m2


def fraction_of_variance_explained(X_nd, Xhat_nd) -> float:
    """FVE of the reconstructions ``Xhat_nd`` of the rows ``X_nd`` (same shape); no rows: a one-line
    ``ValueError`` (there is no variance to explain), a NaN in either: NaN."""
    xp = array_module(X_nd)
    X_nd, Xhat_nd = xp.asarray(X_nd), xp.asarray(Xhat_nd)
    if X_nd.shape != Xhat_nd.shape:
        raise ValueError(f"X_nd {tuple(X_nd.shape)} and Xhat_nd {tuple(Xhat_nd.shape)} differ in shape; give the "
                         f"reconstructions of the same rows")
    if X_nd.size == 0:
        raise ValueError(f"no rows (shape {tuple(X_nd.shape)}): the fraction of variance explained needs at "
                         f"least one row")
    R_nd = xp.asarray(Xhat_nd, dtype=np.float64) - xp.asarray(X_nd, dtype=np.float64)
    return fve_from_sums(float(xp.vdot(R_nd, R_nd)), total_variance(X_nd))


def mean_l0(code_nh) -> float:
    """The mean count of non-zero entries per row (a dense array or a SciPy sparse matrix)."""
    if hasattr(code_nh, "getnnz"):  # scipy.sparse: its stored entries may include explicit zeros
        return float((code_nh != 0).sum()) / code_nh.shape[0]
    return float(array_module(code_nh).count_nonzero(code_nh)) / code_nh.shape[0]


def dead_fraction(code_nh) -> float:
    """The fraction of columns (units) that are zero in every row of ``code_nh``."""
    if hasattr(code_nh, "getnnz"):
        alive_h = np.asarray((code_nh != 0).sum(axis=0)).ravel() > 0
    else:
        alive_h = to_host((code_nh != 0).any(axis=0))
    return float((~alive_h).mean())


class _VarianceSum:
    """Running mean and sum of squared deviations of rows, merged chunk by chunk."""

    def __init__(self):
        self.n, self.mean_d, self.m2 = 0, None, 0.0

    def add(self, X_nd) -> None:
        xp = array_module(X_nd)
        X_nd = xp.asarray(X_nd, dtype=np.float64)
        n_b = X_nd.shape[0]
        if n_b == 0:
            return
        mean_b = X_nd.mean(axis=0)
        D_nd = X_nd - mean_b
        m2_b = float(xp.vdot(D_nd, D_nd))
        if self.n == 0:
            self.n, self.mean_d, self.m2 = n_b, mean_b, m2_b
            return
        delta_d = mean_b - self.mean_d
        n = self.n + n_b
        self.m2 += m2_b + float(xp.vdot(delta_d, delta_d)) * self.n * n_b / n
        self.mean_d = self.mean_d + delta_d * (n_b / n)
        self.n = n

    @classmethod
    def of(cls, X_nd, chunk: int) -> "_VarianceSum":
        total = cls()
        for start in range(0, X_nd.shape[0], chunk):
            total.add(X_nd[start:start + chunk])
        return total


def reconstruction_metrics(params, X_nd, k: int, alpha: float = 1.0, topk_method: str = "sort",
                           activation: str = "linear", backend=CPU, chunk: int = 4096, top=None) -> dict:
    """The metrics of the model ``params`` on the host rows ``X_nd``:

    ``fve`` of the reconstructions through the k largest units (the training's reconstruction), ``l0``
    of that k-code, ``l0_alpha_k`` of the ``alpha*k`` features (what the classifier reads),
    ``alpha``, ``dead_fraction`` (units kept in no row's k-code) and ``rows``.
    ``params`` act on the rows as given (a centred run's: :func:`~ksae_cupy.datasets.preprocess.raw_input_params`).

    ``topk_method`` is accepted for the callers' sake only: every method keeps the same units (the top-k
    contract, :mod:`ksae_cupy.topk`), and sorting gives both codes from one selection, the k largest
    being the first k of the ``alpha*k`` largest.

    ``top``: ``(idx_nK, val_nK)``, the rows' largest units already found, each row in descending order of
    value with at least ``alpha*k`` columns (``ksae-eval``'s one encoding,
    :func:`~ksae_cupy.evaluation.features.top_units`): the metrics then decode them instead of encoding the
    rows again (the encoding was three quarters of these metrics' time)."""
    del topk_method
    W_dh = backend.asarray(params["W_dh"])
    dev = {name: backend.asarray(value, dtype=W_dh.dtype) for name, value in params.items()}
    xp = backend.xp
    H = W_dh.shape[1]
    kept = max(k, alpha_k(k, alpha, H))
    variance, squared_error, nonzero_k, nonzero_alpha = _VarianceSum(), 0.0, 0, 0
    kept_h = np.zeros(H, dtype=np.int64)
    for start in range(0, X_nd.shape[0], chunk):
        X_cd = backend.asarray(X_nd[start:start + chunk], dtype=W_dh.dtype)
        if top is None:
            idx_cK, val_cK = select_units(hidden_preactivations(dev, X_cd), kept, "sort", activation)  # descending
        else:
            idx_cK, val_cK = (a_nK[start:start + chunk, :kept] for a_nK in top)
        idx_ck, val_ck = idx_cK[:, :k], val_cK[:, :k]
        R_cd = _decode_kept(dev, idx_ck, val_ck, backend).astype(np.float64) - X_cd
        squared_error += float(xp.vdot(R_cd, R_cd))
        variance.add(X_cd)
        nonzero_k += int(xp.count_nonzero(val_ck))
        nonzero_alpha += int(xp.count_nonzero(val_cK))
        kept_h += to_host(xp.bincount(idx_ck[val_ck != 0].ravel(), minlength=H))
    rows = int(X_nd.shape[0])
    return {"rows": rows, "fve": fve_from_sums(squared_error, variance.m2), "l0": nonzero_k / max(rows, 1),
            "alpha": float(alpha), "l0_alpha_k": nonzero_alpha / max(rows, 1),
            "dead_fraction": float((kept_h == 0).mean()), "n_dead": int((kept_h == 0).sum())}


def _decode_kept(params, idx_nk, val_nk, backend):
    """``Zs_nh W_dh^T + c_d`` from the kept units only: on the CPU a sparse product (k of H columns), on a
    GPU a dense one."""
    H = params["W_dh"].shape[1]
    if backend.is_gpu:
        return scatter_rows(idx_nk, val_nk, H) @ params["W_dh"].T + params["c_d"]
    import scipy.sparse as sp

    N, k = idx_nk.shape
    Zs_nh = sp.csr_matrix((val_nk.ravel(), idx_nk.ravel(), np.arange(0, N * k + 1, k)), shape=(N, H))
    return np.asarray(Zs_nh @ params["W_dh"].T) + params["c_d"]


# The one meaning of "dead" every command prints (the end of ksae-train, ksae-eval's train row, ksae-plot,
# the export): measured with the final weights on the training rows, as DEAD_DEFINITION says.
DEAD_DEFINITION = "non-zero in the k-code (top k, final weights) of no training row"


def firing_counts(params, X_nd, k: int, activation: str = "linear", backend=CPU, chunk: int = 4096) -> np.ndarray:
    """Per unit, how many rows of ``X_nd`` hold it non-zero in their k-code (the units the reconstruction
    keeps): an int64 host array of H. A unit with a count of 0 is dead (:data:`DEAD_DEFINITION`).
    ``params`` act on the rows as given (a centred run's: :func:`~ksae_cupy.datasets.preprocess.raw_input_params`)."""
    W_dh = backend.asarray(params["W_dh"])
    dev = {name: backend.asarray(value, dtype=W_dh.dtype) for name, value in params.items()}
    xp = backend.xp
    H = W_dh.shape[1]
    counts_h = np.zeros(H, dtype=np.int64)
    for start in range(0, X_nd.shape[0], chunk):
        X_cd = backend.asarray(X_nd[start:start + chunk], dtype=W_dh.dtype)
        idx_ck, val_ck = select_units(hidden_preactivations(dev, X_cd), k, "sort", activation)
        counts_h += to_host(xp.bincount(idx_ck[val_ck != 0].ravel(), minlength=H))
    return counts_h
