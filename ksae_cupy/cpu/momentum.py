"""Momentum SGD on the CPU kernels: the update of :class:`ksae_cupy.momentum_sgd.MomentumSGD`, in fewer passes.

The optimizer is the paper's three lines on plain arrays. Where a trainer runs on NumPy with the
kernels enabled, it chooses one of these instead, once, when it is built
(:mod:`ksae_cupy.training.steps`); they take the optimizer's velocities and change nothing else:

* :func:`fused_step`: each array in one pass (:func:`kernels.momentum_update`), bit for bit NumPy's
  update; an array whose gradient has another memory layout takes NumPy's update.
* :func:`rows_step`: the same, except that ``W_dh``'s gradient comes in parts from the sparse step
  (:class:`ksae_cupy.sparse_step.RowScatterGradient`) and is applied one hidden unit at a time
  (:func:`kernels.momentum_update_rows`): the ``(D, H)`` gradient is never built.
* :func:`parts_step`: gradients in parts that apply themselves (the sparse fine-tuning step's,
  :mod:`ksae_cupy.supervised.sparse_finetune`), the other arrays as :func:`fused_step`.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.cpu import numba_kernels as kernels
from ksae_cupy.momentum_sgd import flush_denormals, momentum_update


def fused_step(optimizer, params, grads, lr: float) -> None:
    """One update of every parameter, each array in one pass (NumPy's update where layouts differ)."""
    for name, value in params.items():
        _fused(value, optimizer.velocities[name], grads[name], optimizer.momentum, lr)


def rows_step(optimizer, params, grads, lr: float) -> None:
    """:func:`fused_step` with ``grads["W_dh"]`` a :class:`~ksae_cupy.sparse_step.RowScatterGradient`,
    applied row by row (``W_dh`` and its velocity stored in Fortran order, as the trainer stores them)."""
    for name, value in params.items():
        if name == "W_dh":
            velocity = optimizer.velocities[name]
            update_weight_rows(value, velocity, grads[name], optimizer.momentum, lr, still_units(optimizer, velocity))
        else:
            _fused(value, optimizer.velocities[name], grads[name], optimizer.momentum, lr)


def still_units(optimizer, V_dh):
    """The flags ``still_h`` of :func:`kernels.momentum_update_rows` for the velocity ``V_dh``: True where its
    row of units is all zero, so an update that keeps no example there can skip the unit (a dead unit costs
    nothing once its velocity has decayed to 0). Kept on the optimizer beside its velocities, and made anew,
    all False (nothing skipped before the kernel has seen the row), for a velocity array it has not seen: a
    restored or shared one."""
    held = getattr(optimizer, "still_units", None)  # (the velocity array they describe, its flags)
    if held is None or held[0] is not V_dh:
        held = optimizer.still_units = (V_dh, np.zeros(V_dh.shape[1], dtype=np.bool_))
    return held[1]


def update_weight_rows(W_dh, V_dh, grad, momentum: float, lr: float, still_h=None) -> None:
    """``V <- m V - lr dW; W <- W + V`` in place, ``dW`` kept in parts (a ``RowScatterGradient``): the main
    loss's rows scattered unit by unit, then the dense rows of the AuxK dead units, when it carries them.
    ``still_h``: as :func:`kernels.momentum_update_rows` (None: no unit skipped)."""
    if not (W_dh.flags.f_contiguous and V_dh.flags.f_contiguous and W_dh.dtype == V_dh.dtype == grad.dtype):
        raise ValueError("the row-by-row update needs W_dh and its velocity in Fortran order, of the gradient's dtype")
    kernels.momentum_update_rows(W_dh.T, V_dh.T, grad.X_nd, grad.R_nd, grad.idx_nk, grad.dZ_nk, grad.val_nk,
                                 momentum, lr, grad.lanes, still_h)
    if grad.dead_m is not None:
        # -lr dWd on both: the same as one update by the summed gradient, up to rounding (auxk_step.py)
        step_md = W_dh.dtype.type(lr) * grad.dWd_md
        W_md, V_md = W_dh.T[grad.dead_m] - step_md, V_dh.T[grad.dead_m] - step_md
        flush_denormals(W_md)
        flush_denormals(V_md)
        W_dh.T[grad.dead_m], V_dh.T[grad.dead_m] = W_md, V_md
        if still_h is not None:
            still_h[grad.dead_m] = False  # their velocity moved outside the kernel


def parts_step(optimizer, params, grads, lr: float) -> None:
    """:func:`fused_step`, where a gradient that is not an array is kept in parts that apply themselves
    (their ``momentum_update``; one that declines, for a memory layout it cannot update, is made an array)."""
    for name, value in params.items():
        v, grad = optimizer.velocities[name], grads[name]
        if not isinstance(grad, np.ndarray):
            if grad.momentum_update(value, v, optimizer.momentum, lr):
                continue
            grad = np.asarray(grad)
        _fused(value, v, grad, optimizer.momentum, lr)


def _fused(theta, velocity, grad, momentum: float, lr: float) -> None:
    if not kernels.momentum_update(theta, velocity, grad, momentum, lr):
        momentum_update(theta, velocity, grad, momentum, lr)
