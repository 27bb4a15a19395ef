"""The sparse training step with the auxiliary loss of Gao et al. (2024) ("AuxK"): beyond the paper.

A separate branch of :func:`ksae_cupy.sparse_step.loss_and_grads_sparse`, taken only when
``aux_k > 0``; the paper's step is not touched. The dense reference, and the loss and its
gradients written out, are :func:`ksae_cupy.model.loss_and_grads_auxk`. Here:

* the main loss through the k kept units, as the sparse step computes it (on the CPU kernels,
  ``Z_nh = X W + b`` first, then the same select/decode kernel); its residual
  ``R_nd = (Xhat_nd - X_nd) / N`` gives the auxiliary target ``e_nd = -N R_nd``, a constant;
* the auxiliary loss on the block of the M dead units only, with dense products: ``Zd_nm`` (their
  columns of the same ``Z_nh``: no second encoder product) keeps each row's top
  ``a = min(aux_k, M)`` (``Za_nm``, zero elsewhere), and with ``Wd_md`` their rows of ``W_hd``:

      Ra_nd  = aux_coef (Za_nm Wd_md - e_nd) / N          (ehat - e, scaled)
      dZa_nm = (Ra_nd Wd_md^T) * (the selected units)
      dWd_md = dZa_nm^T X_nd + Za_nm^T Ra_nd,   db[dead] += sum_n dZa_nm

  ``4 N M D`` multiply-adds in four BLAS products. Why dense and not row scatters like the main
  loss: the dead units are few columns, all of them selected once M <= aux_k, and BLAS does these
  products far faster than a gather loop (measured: 0.25 ms against ~6 ms for M = 135, N = 128).
* ``W``'s update: the main loss's row scatter as the trainer applies it (momentum SGD row by row),
  then ``-lr dWd_md`` on the dead units' rows of both ``W`` and its velocity: the same as one
  update by the summed gradient (``v <- m v - lr (g + ga); w <- w + v``), up to rounding.

The block is array code: NumPy (with or without the Numba kernels) and CuPy alike.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.backend import array_module
from ksae_cupy.cpu import numba_kernels as cpu_kernels
from ksae_cupy.model import ForwardCache, hidden_preactivations, select_units
from ksae_cupy.sparse_step import _backprop_sparse_products, _descending, _in_layout_of, RowScatterGradient
from ksae_cupy.topk import scatter_rows, topk


def loss_and_grads_sparse_auxk(params, X_nd, k: int, dead_h, aux_k: int, aux_coef: float, topk_method: str = "sort",
                               activation: str = "linear", defer_weight_gradient: bool = False, lanes: int = 1):
    """The sparse step plus the auxiliary loss on the ``dead_h`` units: ``(loss, aux_loss, grads, cache)``.

    Same contract as :func:`ksae_cupy.model.loss_and_grads_auxk` (``loss`` the main loss alone,
    ``grads`` those of both); ``grads["W_dh"]`` as :func:`~ksae_cupy.sparse_step.loss_and_grads_sparse`
    returns it (with ``defer_weight_gradient`` on the CPU kernels, parts the CPU kernels' update applies)."""
    xp = array_module(X_nd)
    W_dh, c_d = params["W_dh"], params["c_d"]
    H = W_dh.shape[1]
    relu = activation == "relu"
    kernels = xp is np and cpu_kernels.enabled()
    W_hd = xp.ascontiguousarray(W_dh.T)  # a view when W_dh is stored in Fortran order
    if kernels:
        Z_nh = cpu_kernels.encode(W_dh, params["b_h"], X_nd, lanes)
        loss, idx_nk, val_nk, R_nd, dZ_nk = cpu_kernels.select_decode_and_backprop(
            Z_nh, k, _descending(topk_method), W_hd, c_d, X_nd, relu)
    else:
        Z_nh = hidden_preactivations(params, X_nd)
        idx_nk, val_nk = select_units(Z_nh, k, topk_method, activation)
        loss, R_nd, dZ_nk, dW_hd = _backprop_sparse_products(xp, W_hd, c_d, X_nd, idx_nk, val_nk, activation)
    db_h = xp.bincount(idx_nk.ravel(), weights=dZ_nk.ravel(), minlength=H).astype(W_dh.dtype)
    cache = ForwardCache(X_nd=X_nd, idx_nk=idx_nk, Zs_nh=None, activation=activation, val_nk=val_nk)

    aux = dead_block_gradients(W_hd, X_nd, R_nd, Z_nh, dead_h, aux_k, aux_coef, topk_method, relu)
    aux_loss = 0.0
    if aux is not None:
        aux_loss, dead_m, dWd_md, dbd_m = aux
        db_h[dead_m] += dbd_m
    if kernels:
        if defer_weight_gradient and W_dh.flags.f_contiguous:
            dW_dh = RowScatterGradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, H, lanes)
            if aux is not None:
                dW_dh = GradientWithDeadRows(dW_dh, dead_m, dWd_md)
            grads = {"W_dh": dW_dh, "b_h": db_h, "c_d": R_nd.sum(axis=0)}
            return loss, aux_loss, grads, cache
        dW_hd = cpu_kernels.weight_gradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, H)
    if aux is not None:
        dW_hd[dead_m] += dWd_md
    grads = {"W_dh": _in_layout_of(W_dh, dW_hd), "b_h": db_h, "c_d": R_nd.sum(axis=0)}
    return loss, aux_loss, grads, cache


def dead_block_gradients(W_hd, X_nd, R_nd, Z_nh, dead_h, aux_k: int, aux_coef: float, topk_method: str = "sort",
                         relu: bool = False):
    """``(aux_loss, dead_m, dWd_md, dbd_m)``: the auxiliary loss and its gradients on the rows of ``W_hd``
    and ``b`` of the dead units ``dead_m`` (their indices), by dense products over their block; None when
    no unit is dead. ``R_nd`` is the main loss's ``(Xhat - X) / N``."""
    xp = array_module(X_nd)
    dead_m = xp.flatnonzero(dead_h)
    M = int(dead_m.size)
    a = min(int(aux_k), M)
    if a == 0:
        return None
    N = X_nd.shape[0]
    dtype = X_nd.dtype.type
    Zd_nm = xp.ascontiguousarray(Z_nh[:, dead_m])
    if a < M:  # each row's top a of the dead units; the others are zero and pass no gradient
        local_na, val_na = topk(Zd_nm, a, topk_method)
        Za_nm = scatter_rows(local_na, val_na, M)
        passes_nm = scatter_rows(local_na, xp.ones_like(val_na), M) > 0
    else:  # every dead unit is selected
        Za_nm, passes_nm = Zd_nm, None
    if relu:  # as in the main step: negatives set to zero, and they pass no gradient
        positive_nm = Za_nm > 0
        Za_nm = xp.where(positive_nm, Za_nm, dtype(0))
        passes_nm = positive_nm if passes_nm is None else passes_nm & positive_nm
    Wd_md = W_hd[dead_m]  # a copy of their rows, contiguous
    Ra_nd = Za_nm @ Wd_md + R_nd * dtype(N)  # ehat - e, with e = X - Xhat = -N R
    aux_loss = float(aux_coef) * 0.5 * float(xp.vdot(Ra_nd, Ra_nd)) / N
    Ra_nd *= dtype(aux_coef / N)
    dZa_nm = Ra_nd @ Wd_md.T
    if passes_nm is not None:
        dZa_nm *= passes_nm
    # Both uses of W (encoder and decoder). Two products, not one of the stacked [dZa; Za]^T [X; Ra]:
    # the copies cost more than the products when M is small (0.14 ms against 0.035 ms at M = 5, measured).
    dWd_md = dZa_nm.T @ X_nd
    dWd_md += Za_nm.T @ Ra_nd
    return aux_loss, dead_m, dWd_md, dZa_nm.sum(axis=0)


class GradientWithDeadRows(RowScatterGradient):
    """``dW_dh`` as the main loss's :class:`RowScatterGradient` plus dense rows ``dWd_md`` for the dead
    units ``dead_m``. The momentum update applies the first row by row, then ``-lr dWd_md`` to those
    rows of ``W`` and of its velocity (:func:`ksae_cupy.cpu.momentum.update_weight_rows`);
    ``numpy.asarray`` builds the whole gradient."""

    def __init__(self, main: RowScatterGradient, dead_m, dWd_md):
        super().__init__(main.X_nd, main.R_nd, main.idx_nk, main.dZ_nk, main.val_nk, main.shape[1], main.lanes)
        self.dead_m, self.dWd_md = dead_m, dWd_md

    def __array__(self, dtype=None, copy=None):
        dW_dh = np.array(super().__array__(), order="F")
        dW_dh[:, self.dead_m] += self.dWd_md.T
        return dW_dh if dtype is None else dW_dh.astype(dtype)
