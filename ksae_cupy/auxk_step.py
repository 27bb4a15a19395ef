"""The sparse training step with the auxiliary loss of Gao et al. (2024) ("AuxK"): beyond the paper (issue 35).

A separate branch of :func:`ksae_cupy.sparse_step.loss_and_grads_sparse`, taken only when
``aux_k > 0``; the paper's step is not touched. The dense reference, and the loss and its
gradients written out, are :func:`ksae_cupy.model.loss_and_grads_auxk`. Here, as in the sparse
step, only ``Z_nh = X_nd W_dh + b_h`` touches every unit; after it:

* the main loss through the k kept units, as the sparse step computes it (its residual
  ``R_nd = (Xhat_nd - X_nd) / N`` gives ``e_nd = -N R_nd``);
* the top ``a = min(aux_k, dead units)`` of the dead units' pre-activations per example, read from
  the same ``Z_nh`` (no second encoder product), decoded through their a rows of ``W`` into
  ``ehat_nd``; ``Ra_nd = aux_coef (ehat_nd - e_nd) / N`` and ``dZa_na = Ra_n . W_hd[idx_na]``;
* ``dW``: unit ``idx_na[n, j]`` gets ``dZa_nj X_n + vala_nj Ra_n`` on top of the main loss's rows.

Cost beside the sparse step: ``4 N a D`` multiply-adds (decoder, ``dZa`` and the two uses in ``dW``).

Three ways to run it, as the sparse step: the Numba kernels (:func:`ksae_cupy.cpu.kernels.encode`,
``select_decode_and_backprop`` and ``decode_and_backprop`` for the two reconstructions, and
:mod:`ksae_cupy.cpu.auxk_kernels` for ``W``'s update by both scatters at once); NumPy/SciPy
without them; and CuPy (cuSPARSE products, the top-k kernels of :mod:`ksae_cupy.gpu`).
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.backend import array_module
from ksae_cupy.cpu import kernels as cpu_kernels
from ksae_cupy.model import ForwardCache, hidden_preactivations, select_dead_units, select_units
from ksae_cupy.sparse_step import (_backprop_sparse_products, _csr_rows, _descending, _in_layout_of, _sparse_module,
                                   RowScatterGradient)


def loss_and_grads_sparse_auxk(params, X_nd, k: int, dead_h, aux_k: int, aux_coef: float, topk_method: str = "sort",
                               activation: str = "linear", defer_weight_gradient: bool = False, lanes: int = 1):
    """The sparse step plus the auxiliary loss on the ``dead_h`` units: ``(loss, aux_loss, grads, cache)``.

    Same contract as :func:`ksae_cupy.model.loss_and_grads_auxk` (``loss`` the main loss alone,
    ``grads`` those of both); ``grads["W_dh"]`` as :func:`~ksae_cupy.sparse_step.loss_and_grads_sparse`
    returns it (with ``defer_weight_gradient`` on the CPU kernels, an object the optimizer applies)."""
    xp = array_module(X_nd)
    W_dh, c_d = params["W_dh"], params["c_d"]
    N, H = X_nd.shape[0], W_dh.shape[1]
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
    db_h = xp.bincount(idx_nk.ravel(), weights=dZ_nk.ravel(), minlength=H)
    cache = ForwardCache(X_nd=X_nd, idx_nk=idx_nk, Zs_nh=None, activation=activation, val_nk=val_nk)

    selected = select_dead_units(Z_nh, dead_h, aux_k, topk_method, activation)
    aux_loss = 0.0
    if selected is not None:
        idx_na, val_na = selected
        e_nd = R_nd * X_nd.dtype.type(-N)  # X - Xhat: the target, a constant
        if kernels:
            # The decoder kernel with target e and no bias gives (ehat - e) / N and its dZ.
            aux_loss, Ra_nd, dZa_na = cpu_kernels.decode_and_backprop(W_hd, xp.zeros_like(c_d), e_nd, idx_na,
                                                                      val_na, relu)
        else:
            aux_loss, Ra_nd, dZa_na = _aux_products(xp, W_hd, e_nd, idx_na, val_na, relu)
        aux_loss *= float(aux_coef)
        Ra_nd *= X_nd.dtype.type(aux_coef)
        dZa_na *= X_nd.dtype.type(aux_coef)
        db_h = db_h + xp.bincount(idx_na.ravel(), weights=dZa_na.ravel(), minlength=H)
    db_h = db_h.astype(W_dh.dtype)

    if kernels:
        if defer_weight_gradient and W_dh.flags.f_contiguous:
            main = RowScatterGradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, H, lanes)
            dW_dh = main if selected is None else TwoRowScatterGradient(main, Ra_nd, idx_na, dZa_na, val_na)
        else:
            dW_hd = cpu_kernels.weight_gradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, H)
            if selected is not None:
                dW_hd += cpu_kernels.weight_gradient(X_nd, Ra_nd, idx_na, dZa_na, val_na, H)
            dW_dh = _in_layout_of(W_dh, dW_hd)
    else:
        if selected is not None:
            sparse = _sparse_module(xp)
            # Both uses of W by the auxiliary loss: [dZa; Za]^T [X; Ra].
            dZa_Za = _csr_rows(xp, sparse, xp.concatenate([idx_na, idx_na]), xp.concatenate([dZa_na, val_na]), H)
            dW_hd += xp.asarray(dZa_Za.T @ xp.concatenate([X_nd, Ra_nd]))
        dW_dh = _in_layout_of(W_dh, dW_hd)
    grads = {"W_dh": dW_dh, "b_h": db_h, "c_d": R_nd.sum(axis=0)}
    return loss, aux_loss, grads, cache


def _aux_products(xp, W_hd, e_nd, idx_na, val_na, relu: bool):
    """``(0.5/N sum ||ehat - e||^2, (ehat - e) / N, dZa_na)`` with (cu)SciPy products: ``ehat = Za W``."""
    sparse = _sparse_module(xp)
    N, H = e_nd.shape[0], W_hd.shape[0]
    Ra_nd = xp.asarray(_csr_rows(xp, sparse, idx_na, val_na, H) @ W_hd)
    Ra_nd -= e_nd
    aux_loss = 0.5 * float(xp.vdot(Ra_nd, Ra_nd)) / N
    Ra_nd /= N
    dZa_na = xp.matmul(W_hd[idx_na], Ra_nd[:, :, None])[:, :, 0]
    if relu:  # a selected unit clipped to zero passes no gradient
        dZa_na *= val_na > 0
    return aux_loss, Ra_nd, dZa_na


class TwoRowScatterGradient:
    """``dW_dh`` kept as two row scatters: the main loss's (a :class:`RowScatterGradient`) and the
    auxiliary loss's (``Ra_nd, idx_na, dZa_na, vala_na``, the same form). The momentum update
    applies their sum row by row (:mod:`ksae_cupy.cpu.auxk_kernels`); ``numpy.asarray`` builds it."""

    def __init__(self, main: RowScatterGradient, Ra_nd, idx_na, dZa_na, vala_na):
        self.main = main
        self.aux = (Ra_nd, idx_na, dZa_na, vala_na)
        self.shape, self.dtype = main.shape, main.dtype

    def __array__(self, dtype=None, copy=None):
        Ra_nd, idx_na, dZa_na, vala_na = self.aux
        dW_hd = cpu_kernels.weight_gradient(self.main.X_nd, self.main.R_nd, self.main.idx_nk, self.main.dZ_nk,
                                            self.main.val_nk, self.shape[1])
        dW_hd += cpu_kernels.weight_gradient(self.main.X_nd, Ra_nd, idx_na, dZa_na, vala_na, self.shape[1])
        return dW_hd.T if dtype is None else dW_hd.T.astype(dtype)

    def momentum_update(self, W_dh, V_dh, momentum: float, lr: float) -> bool:
        """``V <- m V - lr dW; W <- W + V`` in place, or False (nothing done) unless both are Fortran-ordered."""
        if not (W_dh.flags.f_contiguous and V_dh.flags.f_contiguous and W_dh.dtype == V_dh.dtype == self.dtype):
            return False
        from ksae_cupy.cpu.auxk_kernels import momentum_update_two_scatters

        m = self.main
        momentum_update_two_scatters(W_dh.T, V_dh.T, m.X_nd, (m.R_nd, m.idx_nk, m.dZ_nk, m.val_nk), self.aux,
                                     momentum, lr)
        return True


def loss_and_grads_auxk_for(step: str, k: int, H: int):
    """The AuxK step (dense reference or sparse) that ``step`` resolves to at this k and H."""
    from ksae_cupy import model
    from ksae_cupy.sparse_step import choose_step

    return loss_and_grads_sparse_auxk if choose_step(step, k, H) == "sparse" else model.loss_and_grads_auxk
