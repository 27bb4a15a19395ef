"""The step a trainer takes, resolved once: the functions it calls for every batch.

Which functions run depends on the backend (NumPy with or without the Numba kernels, or CuPy),
the ``step`` option (dense, sparse, or auto by k / H), the top-k method, the activation and
``aux_k``. None of these changes during a run, only k (the sparsity schedule), and with ``auto``
the step depends on k. So a trainer resolves, when it is built, each step it may take
(:func:`resolve_steps`), and each epoch picks one of them by its k; no batch asks again.

A :class:`Step` gives a batch's gradients in one call, the paper's or with AuxK's auxiliary loss, and
the update that applies them:

    gradients(params, X_nd, k, lanes, X_rows=None, dead_h=None)  -> (loss, aux_loss, grads, cache)
    update(optimizer, params, grads, lr)                         the optimizer's update, in place

``dead_h`` None: the paper's step (``aux_loss`` None); else the AuxK step on the units ``dead_h`` marks.

and :class:`Evaluation` the validation loss's sum of squared errors. ``lanes`` is read when an
epoch starts (:meth:`Step.lanes`): the thread count may be set after the trainer is built (the
estimator scopes it to each ``fit``). ``X_rows``: the batch as rows of its set's CSR form, where the
trainer built one (:class:`ksae_cupy.cpu.sparse_encoder.RunInputs`); the sparse step on the CPU
kernels then encodes from the non-zero inputs, every other step ignores it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from ksae_cupy import model
from ksae_cupy.auxk_step import loss_and_grads_sparse_auxk
from ksae_cupy.cpu import numba_kernels as cpu_kernels
from ksae_cupy.cpu import sparse_encoder
from ksae_cupy.optimizers import OptimizerEntry, lookup
from ksae_cupy.sparse_step import choose_step, loss_and_grads_sparse


@dataclass(frozen=True)
class Step:
    """The functions one trainer calls for each batch of an epoch (see the module's docstring)."""

    kind: str  # "dense" or "sparse"
    in_lanes: bool  # whether it splits its examples over the kernels' threads (the sparse step on the CPU kernels)
    plain: Callable  # (params, X_nd, k[, lanes=, X_rows=]) -> (loss, grads, cache); the sparse one takes the lanes
    auxk: Callable  # (params, X_nd, k, dead_h[, lanes=]) -> (loss, aux_loss, grads, cache)
    update: Callable

    def gradients(self, params, X_nd, k: int, lanes: int = 1, X_rows=None, dead_h=None):
        """``(loss, aux_loss, grads, cache)`` of the batch ``X_nd``: the paper's step (``aux_loss`` None), or
        with ``dead_h`` the AuxK step on those units (:mod:`ksae_cupy.auxk_step`)."""
        sparse = self.kind == "sparse"
        if dead_h is None:
            loss, grads, cache = self.plain(params, X_nd, k, lanes=lanes, X_rows=X_rows) if sparse else \
                self.plain(params, X_nd, k)
            return loss, None, grads, cache
        return self.auxk(params, X_nd, k, dead_h, lanes=lanes) if sparse else self.auxk(params, X_nd, k, dead_h)

    def lanes(self) -> int:
        """The lanes of this step now (:mod:`ksae_cupy.cpu.lanes`): the kernels' thread count, or 1."""
        return cpu_kernels.threads() if self.in_lanes else 1


def resolve_steps(config, xp, W_in_rows: bool, sparse: bool = True, optimizer: OptimizerEntry | None = None) -> dict:
    """``{"dense": Step, "sparse": Step}`` for a trainer with ``config`` on the array module ``xp``.

    ``W_in_rows``: the trainer stores ``W_dh`` in Fortran order (one contiguous row per unit of
    ``W_dh.T``): on the CPU kernels the sparse step then hands ``W``'s gradient over in parts,
    applied row by row, where the optimizer can. ``sparse`` False (the distributed trainers): the dense
    step only. ``optimizer``: the entry of ``config.optimizer`` (looked up when not given).
    """
    optimizer = optimizer or lookup(config.optimizer)
    kernels = xp is np and cpu_kernels.enabled()
    topk, activation, aux_k, aux_coef = config.topk, config.activation, config.aux_k, config.aux_coef
    # One pass per array on the CPU kernels (bit for bit NumPy's update), where the optimizer has them; its own elsewhere.
    fused = optimizer.cpu_step if kernels and optimizer.cpu_step else optimizer.step
    # The settings bound once (partial: no Python frame of its own between a step and its math).
    steps = {"dense": Step("dense", False, partial(model.loss_and_grads, topk_method=topk, activation=activation),
                           partial(model.loss_and_grads_auxk, aux_k=aux_k, aux_coef=aux_coef, topk_method=topk,
                                   activation=activation), fused)}
    if not sparse:
        return steps
    in_parts = kernels and W_in_rows and optimizer.cpu_rows_step is not None  # W's gradient in parts, row by row
    steps["sparse"] = Step("sparse", kernels,
                           partial(loss_and_grads_sparse, topk_method=topk, activation=activation,
                                   defer_weight_gradient=in_parts),
                           partial(loss_and_grads_sparse_auxk, aux_k=aux_k, aux_coef=aux_coef, topk_method=topk,
                                   activation=activation, defer_weight_gradient=in_parts),
                           optimizer.cpu_rows_step if in_parts else fused)
    return steps


def step_kind(config, k: int, sparse: bool = True) -> str:
    """``dense`` or ``sparse``: the step a trainer takes at ``k`` (``auto`` resolved by k / H)."""
    return choose_step(config.step, k, config.hidden) if sparse else "dense"


@dataclass(frozen=True)
class Evaluation:
    """``squared_error(params, X_nd, k, lanes, X_rows=None)``: ``sum_n ||xhat_n - x_n||^2`` through the k kept
    units (``X_rows`` as for :class:`Step`)."""

    in_lanes: bool
    squared_error: Callable

    def lanes(self) -> int:
        return cpu_kernels.threads() if self.in_lanes else 1


def resolve_evaluation(config, xp) -> Evaluation:
    """On the CPU kernels: select and decode through the k kept rows of ``W`` only, in one pass (as the
    sparse step does; the dense decoder would cost as much as the encoder product again). Else the
    dense forward pass."""
    topk, activation = config.topk, config.activation
    if xp is np and cpu_kernels.enabled():
        descending, relu = topk == "sort", activation == "relu"

        def kernels_error(params, X_nd, k, lanes, X_rows=None):
            if X_rows is not None:  # X W from the non-zero inputs
                return sparse_encoder.encode_and_reconstruction_error(X_rows, params["W_dh"], params["b_h"],
                                                                      params["c_d"], X_nd, k, descending, relu, lanes)
            return cpu_kernels.encode_and_reconstruction_error(params["W_dh"], params["b_h"], params["c_d"], X_nd, k,
                                                               descending, relu, lanes)

        return Evaluation(True, kernels_error)

    def dense_error(params, X_nd, k, lanes, X_rows=None):
        Xhat, _ = model.forward(params, X_nd, k, topk, activation)
        R = Xhat - X_nd
        return float(xp.vdot(R, R))

    return Evaluation(False, dense_error)
