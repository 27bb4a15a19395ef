"""Section 3 of the paper, measured: coherence, ITI sparse recovery, and Theorem 3.1.

* :func:`mutual_coherence` -- ``mu(W) = max_{i != j} |<w_i, w_j>|`` with unit-norm columns.
* :func:`iti` -- iterative thresholding with inversion (section 3.1), batched over rows:
  ``Gamma = supp_k(z + W^T (x - W z))`` then ``z_Gamma = W_Gamma^+ x``, ``z_{Gamma^c} = 0``,
  from ``z = 0`` until the support stops changing.
* :func:`theorem_experiment` -- ``x = W z`` with k-sparse non-negative ``z`` drawn to satisfy,
  or to violate, ``k mu <= z_k / (2 z_1)``; how often ``supp_k(W^T x)`` is the true support.
* :func:`encoder_vs_iti` -- on a trained dictionary, how often the one-step encoder's support
  ``supp_k(W^T x + b)`` agrees with the converged ITI support.

Supports are the k *largest* entries (signed), as in the autoencoder and the theorem.
Everything runs on the array module of its inputs, in float64 (the inversion solves
k x k normal equations, whose conditioning float32 would spoil).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ksae_cupy.backend import array_module, to_host
from ksae_cupy.errors import KsaeError
from ksae_cupy.topk import topk

# Relative ridge added to W_Gamma^T W_Gamma so a repeated column gives the least-squares
# (minimum-norm-like) answer instead of a singular solve; far below any real eigenvalue.
_RIDGE = 1e-12


def unit_columns(W_dh):
    """``(Wn_dh, alive_h)``: columns scaled to unit length; all-zero columns left at 0 (no direction:
    not "dead units", which training counts as units no example keeps)."""
    xp = array_module(W_dh)
    norms_h = xp.sqrt((W_dh * W_dh).sum(axis=0))
    alive_h = norms_h > 0
    return W_dh / xp.where(alive_h, norms_h, 1), alive_h


def gram_offdiag_abs(W_dh):
    """``|<w_i, w_j>|`` for i != j of the unit-norm live columns, as a host 1-D array."""
    xp = array_module(W_dh)
    Wn_dh, alive_h = unit_columns(xp.asarray(W_dh, dtype=np.float64))
    Wn_dh = Wn_dh[:, alive_h]
    G_hh = xp.abs(Wn_dh.T @ Wn_dh)
    H = G_hh.shape[0]
    return to_host(G_hh[~xp.eye(H, dtype=bool)])


def mutual_coherence(W_dh) -> float:
    """``mu(W) = max_{i != j} |<w_i, w_j>|`` over unit-normalised columns (zero-norm ones skipped)."""
    off = gram_offdiag_abs(W_dh)
    if off.size == 0:
        raise KsaeError("mutual coherence needs at least two non-zero columns")
    return float(off.max())


def coherence_report(W_dh) -> dict:
    """Mutual coherence and context: the Welch lower bound, typical |<w_i, w_j>|, and the
    sparsity up to which Theorem 3.1 can hold at all (``2 k mu <= 1``)."""
    D, H = W_dh.shape
    off = gram_offdiag_abs(W_dh)
    mu = float(off.max())
    zero_norm = int(H - np.count_nonzero(to_host(unit_columns(W_dh)[1])))
    return {
        "D": int(D), "H": int(H), "zero_norm_columns": zero_norm, "mu": mu,
        # No D x H dictionary with unit columns can have mu below this (H > D).
        "welch_bound": float(np.sqrt((H - D) / (D * (H - 1)))) if H > D else 0.0,
        "mean_abs_inner": float(off.mean()),
        "p99_abs_inner": float(np.quantile(off, 0.99)),
        "theorem_max_k": int(np.floor(1 / (2 * mu))) if mu > 0 else None,
    }


@dataclass
class ItiResult:
    """Converged codes ``Z_nh``, sorted supports ``support_nk``, and per row the iteration
    at which the support stopped changing (``n_iter_n``) and whether it did (``converged_n``)."""

    Z_nh: object
    support_nk: object
    n_iter_n: np.ndarray
    converged_n: np.ndarray


def least_squares_on_support(W_dh, X_nd, idx_nk):
    """``z_Gamma = W_Gamma^+ x`` per row: solves ``(W_G^T W_G) z = W_G^T x``, batched."""
    xp = array_module(W_dh)
    Wg_nkd = W_dh.T[idx_nk]  # the k chosen atoms of each row
    G_nkk = Wg_nkd @ Wg_nkd.transpose(0, 2, 1)
    k = idx_nk.shape[1]
    scale_n = xp.trace(G_nkk, axis1=1, axis2=2) / k
    G_nkk += (_RIDGE * scale_n)[:, None, None] * xp.eye(k)
    rhs_nk1 = Wg_nkd @ X_nd[:, :, None]
    return xp.linalg.solve(G_nkk, rhs_nk1)[:, :, 0]


def iti(W_dh, X_nd, k: int, max_iter: int = 100) -> ItiResult:
    """Iterative thresholding with inversion from ``z = 0`` (section 3.1), all rows at once.

    A row has converged when its support equals the previous iteration's: the inversion
    step is then a fixed point. Stops when every row has converged or after ``max_iter``.
    """
    xp = array_module(W_dh)
    W_dh = xp.asarray(W_dh, dtype=np.float64)
    X_nd = xp.asarray(X_nd, dtype=np.float64)
    N, H = X_nd.shape[0], W_dh.shape[1]
    if not 1 <= k <= min(H, W_dh.shape[0]):
        raise KsaeError(f"ITI needs 1 <= k <= min(D, H) = {min(H, W_dh.shape[0])}; got k={k}")
    if max_iter < 1:
        raise KsaeError(f"max_iter={max_iter} is not allowed; use max_iter >= 1")
    Z_nh = xp.zeros((N, H))
    support_nk = xp.full((N, k), -1, dtype=np.int32)
    n_iter_n = np.full(N, max_iter)
    converged_n = np.zeros(N, dtype=bool)
    rows_n = xp.arange(N)[:, None]
    for it in range(1, max_iter + 1):
        # Support estimation: k largest of z + W^T (x - W z).
        Y_nh = Z_nh + (X_nd - Z_nh @ W_dh.T) @ W_dh
        idx_nk = xp.sort(topk(Y_nh, k, "sort")[0], axis=1)
        same_n = to_host((idx_nk == support_nk).all(axis=1))
        newly = same_n & ~converged_n
        n_iter_n[newly] = it - 1  # the support was already final one iteration earlier
        converged_n |= same_n
        if converged_n.all():
            break
        # Inversion: least squares on the chosen atoms, zero elsewhere.
        Z_nh = xp.zeros((N, H))
        Z_nh[rows_n, idx_nk] = least_squares_on_support(W_dh, X_nd, idx_nk)
        support_nk = idx_nk
    return ItiResult(Z_nh=Z_nh, support_nk=support_nk, n_iter_n=n_iter_n, converged_n=converged_n)


def incoherent_dictionary(D: int):
    """``[I | H_D / sqrt(D)]``: two orthonormal bases (identity and Hadamard), mu = 1/sqrt(D).

    The classic maximally incoherent pair; ``D`` must be a power of two.
    """
    from scipy.linalg import hadamard

    if D < 2 or D & (D - 1):
        raise KsaeError(f"the incoherent dictionary needs D a power of two; got D={D}")
    return np.hstack([np.eye(D), hadamard(D) / np.sqrt(D)])


def gaussian_dictionary(D: int, H: int, rng: np.random.Generator):
    """Gaussian ``D x H`` dictionary with unit-norm columns."""
    W_dh = rng.standard_normal((D, H))
    return W_dh / np.linalg.norm(W_dh, axis=0)


def draw_sparse_codes(H: int, k: int, n: int, min_ratio: float, satisfy: bool, rng: np.random.Generator):
    """``(Z_nh, support_nk)``: n non-negative k-sparse codes on random supports.

    With ``satisfy`` every code has ``z_k / z_1 >= min_ratio`` (values in [min_ratio, 1]);
    otherwise ``z_k / z_1 < min_ratio``: the largest is 1, the smallest drawn below
    ``min_ratio`` and the rest in between.
    """
    support_nk = np.sort(np.argsort(rng.random((n, H)), axis=1)[:, :k], axis=1)
    if satisfy:
        if min_ratio > 1:
            raise KsaeError(f"k*mu = {min_ratio / 2:.3g} > 1/2: no k-sparse code can satisfy Theorem 3.1's "
                            "condition on this dictionary; lower k or use a less coherent dictionary")
        vals_nk = rng.uniform(min_ratio, 1.0, (n, k))
    else:
        top = min(min_ratio, 1.0)
        smallest_n = rng.uniform(0, top, n) * (1 - 1e-9)
        vals_nk = rng.uniform(smallest_n[:, None], 1.0, (n, k))
        vals_nk[:, 0] = 1.0
        if k > 1:
            vals_nk[:, 1] = smallest_n
        vals_nk = rng.permuted(vals_nk, axis=1)  # the largest need not sit on the lowest index
    Z_nh = np.zeros((n, H))
    np.put_along_axis(Z_nh, support_nk, vals_nk, axis=1)
    return Z_nh, support_nk


def support_recovery_rate(W_dh, Z_nh, support_nk) -> float:
    """Fraction of rows for which ``supp_k(W^T x)`` with ``x = W z`` is exactly ``supp(z)``."""
    xp = array_module(W_dh)
    k = support_nk.shape[1]
    Y_nh = (xp.asarray(Z_nh) @ W_dh.T) @ W_dh
    found_nk = to_host(xp.sort(topk(Y_nh, k, "sort")[0], axis=1))
    return float(np.mean((found_nk == support_nk).all(axis=1)))


def theorem_experiment(W_dh, k: int, n: int = 1000, seed: int = 0) -> dict:
    """Theorem 3.1 in numbers: recovery by ``supp_k(W^T x)`` when its condition holds and
    when it is violated. ``W_dh`` is normalised to unit columns first (the theorem's premise).
    """
    if not 1 <= k <= W_dh.shape[1]:
        raise KsaeError(f"k={k} is not allowed for {W_dh.shape[1]} atoms; use 1 <= k <= {W_dh.shape[1]}")
    rng = np.random.default_rng(seed)
    xp = array_module(W_dh)
    Wn_dh, alive_h = unit_columns(xp.asarray(W_dh, dtype=np.float64))
    Wn_dh = Wn_dh[:, alive_h]  # zero-norm columns are no atoms at all
    H = Wn_dh.shape[1]
    mu = mutual_coherence(Wn_dh)
    min_ratio = 2 * k * mu  # the condition k mu <= z_k / (2 z_1), as a bound on z_k / z_1
    result = {"D": int(Wn_dh.shape[0]), "H": int(H), "k": int(k), "mu": mu, "k_mu": k * mu, "n": int(n),
              "condition_satisfiable": min_ratio <= 1}
    if min_ratio <= 1:
        Z_nh, support_nk = draw_sparse_codes(H, k, n, min_ratio, True, rng)
        result["recovery_when_satisfied"] = support_recovery_rate(Wn_dh, Z_nh, support_nk)
    else:
        result["recovery_when_satisfied"] = None
    if k == 1 and min_ratio <= 1:
        result["recovery_when_violated"] = None  # z_1 / z_1 = 1 >= 2 mu: a 1-sparse code always satisfies it
    else:
        Z_nh, support_nk = draw_sparse_codes(H, k, n, min_ratio, False, rng)
        result["recovery_when_violated"] = support_recovery_rate(Wn_dh, Z_nh, support_nk)
    return result


def encoder_vs_iti(params, X_nd, k: int, max_iter: int = 100) -> dict:
    """Does the encoder's one step find the support ITI converges to, on a trained dictionary?

    ITI solves ``x - c = W z`` (the decoder bias ``c`` removed, as the autoencoder's output
    is ``W z + c``) with the trained, unnormalised ``W``. Compared with the converged ITI
    support: the encoder's ``supp_k(W^T x + b)`` and ITI's own first step ``supp_k(W^T (x - c))``.
    """
    xp = array_module(params["W_dh"])
    W_dh = xp.asarray(params["W_dh"], dtype=np.float64)
    X_nd = xp.asarray(X_nd, dtype=np.float64)
    Xc_nd = X_nd - xp.asarray(params["c_d"], dtype=np.float64)
    result = iti(W_dh, Xc_nd, k, max_iter)
    iti_nk = to_host(result.support_nk)
    encoder_nk = np.sort(to_host(topk(X_nd @ W_dh + xp.asarray(params["b_h"], dtype=np.float64), k, "sort")[0]), axis=1)
    first_nk = np.sort(to_host(topk(Xc_nd @ W_dh, k, "sort")[0]), axis=1)

    def agreement(a_nk):
        overlap_n = np.array([np.intersect1d(a, b).size for a, b in zip(a_nk, iti_nk)]) / k
        return {"exact_support_rate": float(np.mean((a_nk == iti_nk).all(axis=1))),
                "mean_overlap": float(overlap_n.mean())}

    # Reconstruction errors, relative to ||x - c||: one-step least squares vs converged ITI.
    norm_n = to_host(xp.sqrt((Xc_nd ** 2).sum(axis=1)))
    Z_enc_nk = least_squares_on_support(W_dh, Xc_nd, xp.asarray(encoder_nk))
    R_enc_nd = Xc_nd - (Z_enc_nk[:, :, None] * W_dh.T[xp.asarray(encoder_nk)]).sum(axis=1)
    R_iti_nd = Xc_nd - result.Z_nh @ W_dh.T
    rel = lambda R: float(np.mean(to_host(xp.sqrt((R ** 2).sum(axis=1))) / np.maximum(norm_n, 1e-12)))  # noqa: E731
    return {
        "n": int(X_nd.shape[0]), "k": int(k), "max_iter": int(max_iter),
        "iti_converged_rate": float(result.converged_n.mean()),
        "iti_mean_iterations": float(result.n_iter_n.mean()),
        "encoder_vs_iti": agreement(encoder_nk),
        "first_step_vs_iti": agreement(first_nk),
        "relative_residual_encoder_support": rel(R_enc_nd),
        "relative_residual_iti": rel(R_iti_nd),
    }
