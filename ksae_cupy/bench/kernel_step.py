"""Benchmark only: a training step built on the CUDA kernels, which no trainer takes.

The alternative to :func:`ksae_cupy.model.loss_and_grads`'s generic array code on CuPy arrays,
with fewer passes over memory; same contract, the same results to rounding (tests/gpu). It is
here for ``ksae-bench gpu`` (:mod:`ksae_cupy.bench.gpu`), which times it beside the dense step:
it has neither the ReLU activation nor the AuxK loss, and no ``--step`` choice selects it, so the
training package never imports it. Making it a step would mean a ``step`` value the trainer
resolves (:mod:`ksae_cupy.training.steps`) once it covers what the dense step does.
"""
from __future__ import annotations

from ksae_cupy.gpu.cuda_kernels import mask_rows_gpu, topk_gpu
from ksae_cupy.model import ForwardCache


def loss_and_grads_fused(params, X_nd, k: int, topk_method: str = "threshold"):
    """Same results as :func:`ksae_cupy.model.loss_and_grads` on cupy arrays, with fewer passes.

    The top-k kernel writes the dense sparse code ``Zs_nh`` itself (no separate scatter), and the
    gradient through the kept units is one fused gather + scatter (:func:`mask_rows_gpu`) instead
    of ``take_along_axis`` followed by a scatter. Returns ``(loss, grads, cache)``.
    """
    import cupy

    return fused_step(params, X_nd, k, topk_method, xp=cupy,
                      topk_dense=lambda Z_nh, k_, method: topk_gpu(Z_nh, k_, method, dense=True),
                      mask_rows=mask_rows_gpu)


def fused_step(params, X_nd, k: int, topk_method: str, *, xp, topk_dense, mask_rows):
    """The fused step's arithmetic, given its array module and its two kernels.

    ``topk_dense(Z_nh, k, method) -> (idx_nk, val_nk, Zs_nh)`` and ``mask_rows(src_nh, idx_nk) ->
    dZ_nh``. On a GPU they are the CUDA launchers; the CPU harness of the kernels
    (tests/gpu/test_kernels_host.py) passes NumPy and the same kernels run on the CPU.
    """
    W_dh = params["W_dh"]
    Z_nh = xp.ascontiguousarray(X_nd @ W_dh + params["b_h"])
    idx_nk, _val_nk, Zs_nh = topk_dense(Z_nh, k, topk_method)
    R_nd = Zs_nh @ W_dh.T + params["c_d"]
    R_nd -= X_nd
    N = X_nd.shape[0]
    loss = 0.5 * float(xp.vdot(R_nd, R_nd)) / N
    R_nd /= N
    dZ_nh = mask_rows(xp.ascontiguousarray(R_nd @ W_dh), idx_nk)
    dW_dh = xp.concatenate([X_nd, R_nd]).T @ xp.concatenate([dZ_nh, Zs_nh])
    grads = {"W_dh": dW_dh, "b_h": dZ_nh.sum(axis=0), "c_d": R_nd.sum(axis=0)}
    return loss, grads, ForwardCache(X_nd=X_nd, idx_nk=idx_nk, Zs_nh=Zs_nh)
