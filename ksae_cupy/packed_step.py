"""The paper's step for a stack of models at once: R k-sparse autoencoders of one shape, one batch each.

The dense step of :mod:`ksae_cupy.model` (the same equations, the same names), with a leading axis
``m`` over the models of the stack: ``W_mdh`` holds m weight matrices, ``X_mnd`` one batch per model.
Every product is one batched ``xp.matmul`` over the stack, so on a GPU the m small products of the
paper's 784 x 1000 model become one launch that fills the device.
The top-k sees the m batches as the rows of one ``(m n, H)`` array: the models of one stack share k
(a pack with several k takes one stack per k, :mod:`ksae_cupy.training.packed`).

    Z_mnh   = X_mnd W_mdh + b_mh
    Zs_mnh  = Z on each row's k largest units, 0 elsewhere (after ``activation``)
    Xhat    = Zs_mnh W_mdh^T + c_md ;  loss_m = 0.5/n sum ||Xhat - X||^2  (one loss per model)
    R_mnd   = (Xhat - X) / n
    dZ_mnh  = (R_mnd W_mdh) on the kept units ;  db_mh = sum_n dZ ;  dc_md = sum_n R
    dW_mdh  = [X; R]^T [dZ; Zs]   per model

Each model's slice equals :func:`ksae_cupy.model.loss_and_grads` of that model within float
rounding (the sums may run in another order); tests/test_packed_step.py checks both in float64.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.backend import array_module
from ksae_cupy.model import select_units
from ksae_cupy.momentum_sgd import flush_denormals
from ksae_cupy.topk import scatter_rows


def stacked_loss_and_grads(W_mdh, b_mh, c_md, X_mnd, k: int, topk_method: str = "sort",
                           activation: str = "linear"):
    """One forward and backward pass of every model of the stack: ``(sq_error_m, grads, idx_mnk, val_mnk)``.

    ``sq_error_m``: each model's ``sum ||Xhat - X||^2`` on its batch (a device array of m, in the batch's float
    type; a model's loss is ``0.5 / n`` times its entry);
    ``grads``: ``{"W_dh": dW_mdh, "b_h": db_mh, "c_d": dc_md}``; ``idx_mnk``/``val_mnk``: the kept units.
    """
    xp = array_module(X_mnd)
    m, n, _ = X_mnd.shape
    H = W_mdh.shape[2]
    Z_mnh = xp.matmul(X_mnd, W_mdh) + b_mh[:, None, :]
    idx_rk, val_rk = select_units(Z_mnh.reshape(m * n, H), k, topk_method, activation)  # rows r = (model, example)
    Zs_mnh = scatter_rows(idx_rk, val_rk, H).reshape(m, n, H)
    W_mhd = W_mdh.transpose(0, 2, 1)
    R_mnd = xp.matmul(Zs_mnh, W_mhd) + c_md[:, None, :]
    R_mnd -= X_mnd
    sq_error_m = (R_mnd * R_mnd).sum(axis=(1, 2))
    R_mnd /= X_mnd.dtype.type(n)
    dZs_mnh = xp.matmul(R_mnd, W_mdh)
    dZ_rk = xp.take_along_axis(dZs_mnh.reshape(m * n, H), idx_rk, axis=1)
    if activation == "relu":  # a kept unit clipped to zero passes no gradient
        dZ_rk *= val_rk > 0
    dZ_mnh = scatter_rows(idx_rk, dZ_rk, H).reshape(m, n, H)
    # Both uses of W in one product per model: [X; R]^T [dZ; Zs] = X^T dZ + R^T Zs.
    XR_mnd = xp.concatenate([X_mnd, R_mnd], axis=1)
    dW_mdh = xp.matmul(XR_mnd.transpose(0, 2, 1), xp.concatenate([dZ_mnh, Zs_mnh], axis=1))
    grads = {"W_dh": dW_mdh, "b_h": dZ_mnh.sum(axis=1), "c_d": R_mnd.sum(axis=1)}
    return sq_error_m, grads, idx_rk.reshape(m, n, k), val_rk.reshape(m, n, k)


def kept_counts(idx_mnk, H: int):
    """``kept_mh``: per model, how many of its examples kept each unit. A scatter of ones summed over the
    examples, not ``bincount``: CuPy's reads the largest index back to the host, a wait on every step."""
    xp = array_module(idx_mnk)
    m, n, k = idx_mnk.shape
    ones_rk = xp.ones((m * n, k), dtype=np.int32)
    return scatter_rows(idx_mnk.reshape(m * n, k), ones_rk, H).reshape(m, n, H).sum(axis=1, dtype=np.int64)


def stacked_momentum_update(theta_m, v_m, grad_m, momentum_m, lr_m) -> None:
    """``v <- mu v - lr grad; theta <- theta + v`` in place for every model, each with its own ``momentum_m[i]``
    and ``lr_m[i]`` (device arrays of the parameters' float type, one value per model): per element the very
    operations of :func:`ksae_cupy.momentum_sgd.momentum_update`, the denormals flushed as there."""
    shape = (-1,) + (1,) * (theta_m.ndim - 1)
    v_m *= momentum_m.reshape(shape)
    v_m -= lr_m.reshape(shape) * grad_m
    flush_denormals(v_m)
    theta_m += v_m
    flush_denormals(theta_m)
