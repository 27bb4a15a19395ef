"""The training step that exploits the k-sparse code: only the encoder product stays dense.

Same contract and same results as :func:`ksae_cupy.model.loss_and_grads` (the dense
reference): ``(loss, grads, cache)``. Only ``Z_nh = X_nd W_dh + b_h`` needs every hidden
unit; everything after the top-k touches the k kept rows of ``W_hd = W_dh^T`` per example:

    Xhat_n   = c + sum_j val_nj W_hd[idx_nj]       decoder: N k D multiply-adds
    dZ_nj    = R_n . W_hd[idx_nj]                  the gradient at the kept units only
    db_h     = scatter-add of dZ_nk into the kept units
    dW_hd[h] = sum over (n, j) with idx_nj = h of dZ_nj X_n + val_nj R_n     2 N k D

That is N D H + 4 N k D multiply-adds instead of the dense step's 5 N D H. Where the
inputs are sparse too (MNIST: 19% non-zero), the CPU kernels compute ``X W`` from each example's
non-zero inputs instead (:mod:`ksae_cupy.cpu.sparse_encoder`; the trainer passes ``X_rows``).
The dense (N, H) code ``Zs_nh`` is never built: the cache holds ``idx_nk`` and ``val_nk``.

Three ways to run it, one contract:

* NumPy with Numba (the ``fast`` extra): the loops of :mod:`ksae_cupy.cpu.numba_kernels`. The
  decoder and ``dZ`` are one pass per example; with ``defer_weight_gradient`` the trainer's
  momentum update (:mod:`ksae_cupy.cpu.momentum`) applies ``dW`` row by row and the ``(D, H)`` gradient is never built.
* NumPy without Numba: SciPy CSR products (decoder, ``dW``) and a batched gather for ``dZ``.
* CuPy: the same products through cupyx.scipy.sparse (cuSPARSE). Not yet run on a GPU.

``W_dh`` stored in Fortran order (:func:`sparse_layout`, what the trainer does) makes
``W_dh.T`` the contiguous ``W_hd`` all of these want, with no copy per step.
"""
from __future__ import annotations

import functools

import numpy as np

from ksae_cupy.backend import array_module
from ksae_cupy.cpu import numba_kernels as cpu_kernels
from ksae_cupy.cpu import sparse_encoder
from ksae_cupy.errors import OptionError, literal
from ksae_cupy.model import ForwardCache, hidden_preactivations, select_units
from ksae_cupy.topk import TOPK_METHODS

STEPS = ("dense", "sparse", "auto")

# ``auto`` takes the sparse step when k / H is at most this. Measured on the CPU with
# `ksae-bench train --k-sweep 10,40,70,100,250,500` (the benchmarks' history page in docs/), H = 1000:
# with the Numba kernels the sparse step is 1.35x the dense one's speed at k = 250 and 0.88x at
# k = 500; without them about even at k = 100 and 0.57x at k = 250.
AUTO_MAX_K_OVER_H = {"cpu kernels": 0.25, "otherwise": 0.1}


def choose_step(step: str, k: int, H: int) -> str:
    """``dense`` or ``sparse``: ``auto`` resolved by the fraction of units kept. Another ``step`` is an
    :class:`~ksae_cupy.errors.OptionError` of the field ``step``."""
    if step not in STEPS:
        raise OptionError("step", f"{{name}} {literal(repr(step))} is not allowed; use one of {', '.join(STEPS)}")
    if step == "auto":
        limit = AUTO_MAX_K_OVER_H["cpu kernels" if cpu_kernels.enabled() else "otherwise"]
        return "sparse" if k <= limit * H else "dense"
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


def loss_and_grads_sparse(params, X_nd, k: int, topk_method: str = "sort", activation: str = "linear",
                          defer_weight_gradient: bool = False, lanes: int = 1, X_rows=None):
    """One forward and backward pass through the kept units only: ``(loss, grads, cache)``.

    ``grads["W_dh"]`` comes back in the memory order of ``params["W_dh"]``. Store ``W_dh``
    in Fortran order (:func:`sparse_layout`) and no step copies it: ``W_dh.T`` is then the
    contiguous ``W_hd`` every sparse product wants, and the gradient is a view of ``dW_hd``.

    ``defer_weight_gradient`` (the trainer's setting): where the CPU kernels run and ``W_dh``
    is in Fortran order, ``grads["W_dh"]`` is a :class:`RowScatterGradient` that the CPU kernels'
    momentum update (:mod:`ksae_cupy.cpu.momentum`) applies without ever building the ``(D, H)`` array.

    ``lanes`` (CPU kernels only): split the examples, and the update's hidden units, over that many
    threads (:mod:`ksae_cupy.cpu.lanes`), each running its share of ``X W`` too; the caller runs
    BLAS on one thread meanwhile (the trainer does). Same results, bit for bit, at any count.

    ``X_rows`` (CPU kernels only; ignored elsewhere): the examples of ``X_nd`` as rows of their set's CSR
    form (:mod:`ksae_cupy.cpu.sparse_encoder`, what the trainer gives for sparse enough inputs): ``X W`` is
    then computed from their non-zero inputs instead of by BLAS. Equal within float32 rounding.
    """
    xp = array_module(X_nd)
    W_dh = params["W_dh"]
    H = W_dh.shape[1]
    if xp is np and cpu_kernels.enabled():
        # X W + b (from the non-zero inputs when X_rows is given), then the top k, the decoder and dZ in
        # one pass over the examples.
        forward = (cpu_kernels.encode_select_decode_and_backprop if X_rows is None else
                   functools.partial(sparse_encoder.encode_select_decode_and_backprop, X_rows))
        loss, idx_nk, val_nk, R_nd, dZ_nk = forward(W_dh, params["b_h"], params["c_d"], X_nd, k,
                                                    _descending(topk_method), activation == "relu", lanes)
        if defer_weight_gradient and W_dh.flags.f_contiguous:
            dW_dh = RowScatterGradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, H, lanes)
        else:
            dW_dh = _in_layout_of(W_dh, cpu_kernels.weight_gradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, H))
    else:
        Z_nh = hidden_preactivations(params, X_nd)  # the one dense product
        W_hd = xp.ascontiguousarray(W_dh.T)  # a view when W_dh is stored in Fortran order
        idx_nk, val_nk = select_units(Z_nh, k, topk_method, activation)
        loss, R_nd, dZ_nk, dW_hd = _backprop_sparse_products(xp, W_hd, params["c_d"], X_nd, idx_nk, val_nk,
                                                             activation)
        dW_dh = _in_layout_of(W_dh, dW_hd)
    db_h = xp.bincount(idx_nk.ravel(), weights=dZ_nk.ravel(), minlength=H).astype(W_dh.dtype)
    grads = {"W_dh": dW_dh, "b_h": db_h, "c_d": R_nd.sum(axis=0)}
    return loss, grads, ForwardCache(X_nd=X_nd, idx_nk=idx_nk, Zs_nh=None, activation=activation, val_nk=val_nk)


def _descending(topk_method: str) -> bool:
    """Whether ``topk_method`` returns each row's kept units in descending order (``sort``) or in
    ascending column order (``threshold``); the CPU kernels select in the same order."""
    if topk_method not in TOPK_METHODS:
        raise OptionError("topk", f"{{name}} {literal(repr(topk_method))} is not allowed; use one of "
                                  f"{', '.join(TOPK_METHODS)}")
    return topk_method == "sort"


def _in_layout_of(W_dh, dW_hd):
    """``dW_hd.T`` in the memory order of ``W_dh``: a view for Fortran order, a copy for C order."""
    return dW_hd.T if W_dh.flags.f_contiguous else array_module(dW_hd).ascontiguousarray(dW_hd.T)


class RowScatterGradient:
    """``dW_dh`` kept as its parts: unit ``idx_nk[n, j]`` gets ``dZ_nk[n, j] X_n + val_nk[n, j] R_n``.

    The trainer's momentum update on the CPU kernels applies it row by row
    (:func:`ksae_cupy.cpu.momentum.update_weight_rows`); ``numpy.asarray`` builds the dense
    ``(D, H)`` gradient for anything else. ``dead_m``/``dWd_md``: dense rows of the AuxK dead units
    to add (:class:`ksae_cupy.auxk_step.GradientWithDeadRows` sets them), else None.
    """

    dead_m = dWd_md = None

    def __init__(self, X_nd, R_nd, idx_nk, dZ_nk, val_nk, H: int, lanes: int = 1):
        self.X_nd, self.R_nd, self.idx_nk, self.dZ_nk, self.val_nk = X_nd, R_nd, idx_nk, dZ_nk, val_nk
        self.lanes = lanes
        self.shape = (X_nd.shape[1], H)
        self.dtype = X_nd.dtype

    def __array__(self, dtype=None, copy=None):
        dW_hd = cpu_kernels.weight_gradient(self.X_nd, self.R_nd, self.idx_nk, self.dZ_nk, self.val_nk, self.shape[1])
        return dW_hd.T if dtype is None else dW_hd.T.astype(dtype)


def _backprop_sparse_products(xp, W_hd, c_d, X_nd, idx_nk, val_nk, activation: str):
    """``(loss, R_nd, dZ_nk, dW_hd)`` with (cu)SciPy sparse products: the path without Numba, and on the GPU."""
    sparse = _sparse_module(xp)
    N = X_nd.shape[0]
    H = W_hd.shape[0]
    Zs = _csr_rows(xp, sparse, idx_nk, val_nk, H)
    R_nd = xp.asarray(Zs @ W_hd) + c_d
    R_nd -= X_nd
    loss = 0.5 * float(xp.vdot(R_nd, R_nd)) / N
    R_nd /= N
    # dZ at the kept units: each is R_n . (a kept row of W_hd), a batched matrix-vector product.
    dZ_nk = xp.matmul(W_hd[idx_nk], R_nd[:, :, None])[:, :, 0]
    if activation == "relu":  # a kept unit clipped to zero passes no gradient
        dZ_nk *= val_nk > 0
    # Both uses of W in one sparse product: [dZ; Zs]^T [X; R] = (X^T dZ + R^T Zs)^T.
    dZ_Zs = _csr_rows(xp, sparse, xp.concatenate([idx_nk, idx_nk]), xp.concatenate([dZ_nk, val_nk]), H)
    dW_hd = xp.asarray(dZ_Zs.T @ xp.concatenate([X_nd, R_nd]))
    return loss, R_nd, dZ_nk, dW_hd


def sparse_layout(W_dh):
    """``W_dh`` in the memory order the sparse step wants: Fortran order, so ``W_dh.T`` is
    the contiguous ``(H, D)`` array of one row per hidden unit. Same values, same shape."""
    return array_module(W_dh).asfortranarray(W_dh)
