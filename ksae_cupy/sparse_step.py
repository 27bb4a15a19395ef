"""The training step that exploits the k-sparse code: only the encoder product stays dense.

Same contract and same results as :func:`ksae_cupy.model.loss_and_grads` (the dense
reference): ``(loss, grads, cache)``. Only ``Z_nh = X_nd W_dh + b_h`` needs every hidden
unit; everything after the top-k touches the k kept columns of ``W`` per row:

    W_hd     = W_dh^T, contiguous, so a kept column of W is one contiguous row
    Xhat_nd  = Zs W^T + c          a CSR (N, H) code times W_hd: N k D multiply-adds
    dZ_nk    = R_n . W[:, idx_nk]  the gradient at the kept units only (gathered rows of W_hd)
    db_h     = scatter-add of dZ_nk into the kept units
    dW_dh    = [X; R]^T [dZ; Zs]   one CSR product over the 2 N k kept entries

That is N D H + 4 N k D multiply-adds instead of 5 N D H (section "Why" of issue 14).
The dense (N, H) code ``Zs_nh`` is never built: the cache holds ``idx_nk`` and ``val_nk``.

Works on NumPy (scipy.sparse) and on CuPy (cupyx.scipy.sparse, i.e. cuSPARSE) arrays;
no custom kernel is needed.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.backend import array_module
from ksae_cupy.model import ForwardCache, hidden_preactivations, select_units

STEPS = ("dense", "sparse", "auto")

# ``auto`` takes the sparse step when k / H is at most this. Measured on the CPU with
# `ksae-bench train --k-sweep 10,40,70,100,250` (README, benchmark section), H = 1000:
# sparse 1.6-2.4x faster up to k = 70, about even at k = 100, 0.57x at k = 250.
AUTO_MAX_K_OVER_H = 0.1


def choose_step(step: str, k: int, H: int) -> str:
    """``dense`` or ``sparse``: ``auto`` resolved by the fraction of units kept."""
    if step not in STEPS:
        from ksae_cupy.errors import KsaeError
        raise KsaeError(f"--step {step!r} is not allowed; use one of {', '.join(STEPS)}")
    if step == "auto":
        return "sparse" if k <= AUTO_MAX_K_OVER_H * H else "dense"
    return step


def _sparse_module(xp):
    if xp is np:
        import scipy.sparse
        return scipy.sparse
    import cupyx.scipy.sparse
    return cupyx.scipy.sparse


def _csr_rows(xp, sparse, idx_nk, val_nk, H: int):
    """The (N, H) code as CSR: row n holds the k values ``val_nk[n]`` at columns ``idx_nk[n]``."""
    N, k = idx_nk.shape
    indptr = xp.arange(0, N * k + 1, k, dtype=np.int32)
    return sparse.csr_matrix((val_nk.ravel(), idx_nk.ravel().astype(np.int32), indptr), shape=(N, H))


def loss_and_grads_sparse(params, X_nd, k: int, topk_method: str = "sort", activation: str = "linear"):
    """One forward and backward pass through the kept units only: ``(loss, grads, cache)``."""
    xp = array_module(X_nd)
    sparse = _sparse_module(xp)
    W_dh = params["W_dh"]
    N, D = X_nd.shape
    H = W_dh.shape[1]
    Z_nh = hidden_preactivations(params, X_nd)  # the one dense product
    idx_nk, val_nk = select_units(Z_nh, k, topk_method, activation)
    W_hd = xp.ascontiguousarray(W_dh.T)
    Zs = _csr_rows(xp, sparse, idx_nk, val_nk, H)
    R_nd = xp.asarray(Zs @ W_hd) + params["c_d"]
    R_nd -= X_nd
    loss = 0.5 * float(xp.vdot(R_nd, R_nd)) / N
    R_nd /= N
    # dZ at the kept units: each is R_n . (a kept column of W), a batched matrix-vector product.
    Wkept_nkd = W_hd[idx_nk]
    dZ_nk = xp.matmul(Wkept_nkd, R_nd[:, :, None])[:, :, 0]
    if activation == "relu":  # a kept unit clipped to zero passes no gradient
        dZ_nk *= val_nk > 0
    db_h = xp.bincount(idx_nk.ravel(), weights=dZ_nk.ravel(), minlength=H).astype(W_dh.dtype)
    # Both uses of W in one sparse product: [dZ; Zs]^T [X; R] = (X^T dZ + R^T Zs)^T.
    dZ_Zs = _csr_rows(xp, sparse, xp.concatenate([idx_nk, idx_nk]), xp.concatenate([dZ_nk, val_nk]), H)
    dW_hd = xp.asarray(dZ_Zs.T @ xp.concatenate([X_nd, R_nd]))
    # A contiguous copy: the optimizer's update over a transposed view costs far more (measured ~4x).
    grads = {"W_dh": xp.ascontiguousarray(dW_hd.T), "b_h": db_h, "c_d": R_nd.sum(axis=0)}
    return loss, grads, ForwardCache(X_nd=X_nd, idx_nk=idx_nk, Zs_nh=None, activation=activation, val_nk=val_nk)


def loss_and_grads_for(step: str, k: int, H: int):
    """The step function (dense reference or sparse) that ``step`` resolves to at this k and H."""
    from ksae_cupy import model
    return loss_and_grads_sparse if choose_step(step, k, H) == "sparse" else model.loss_and_grads
