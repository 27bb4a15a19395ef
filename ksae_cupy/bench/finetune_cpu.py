"""``ksae-bench finetune``: the dense and the sparse fine-tuning step on the CPU, in milliseconds per step.

Nets of the paper's supervised MNIST rows: 784-1000-10 and 784-1000-1000-10, every hidden layer
keeping alpha*k = 75 units, batch 128, phase ``all`` (every parameter learns). The dense step is
:func:`ksae_cupy.supervised.finetune.loss_and_grads`; the sparse step
(:mod:`ksae_cupy.supervised.sparse_finetune`) keeps only layer 1's ``X W1`` dense, so ``X W1``
alone is timed too, as the floor. Each step includes the momentum update, as the trainer runs
it: for the sparse step ``W1`` in Fortran order and the weight gradients in parts, applied row
by row. With the CPU kernels on, the sparse step is also timed without them (SciPy).

Validated first on one batch: the float64 sparse gradients against the float64 dense ones (the
same math: equal to rounding), then each float32 step against the float64 dense reference.
Each contender is timed as the median of ``repeats`` repeats of ``steps`` steps, with BLAS and
the CPU kernels on ``threads`` threads.
"""
from __future__ import annotations

import os

import numpy as np

from ksae_cupy import paper
from ksae_cupy.bench.metadata import run_metadata
from ksae_cupy.bench.train_cpu import _cpu_kernels_setting, _median_seconds, _thread_limit
from ksae_cupy.cpu import numba_kernels as cpu_kernels
from ksae_cupy.cpu import momentum as cpu_momentum
from ksae_cupy.errors import KsaeError
from ksae_cupy.momentum_sgd import MomentumSGD
from ksae_cupy.sparse_step import sparse_layout
from ksae_cupy.supervised import finetune
from ksae_cupy.supervised.sparse_finetune import loss_and_grads_sparse

FLOAT32_TOLERANCE = 1e-3  # float32 vs float64 gradients, relative to the largest entry
FLOAT64_TOLERANCE = 1e-9  # sparse vs dense, both float64: the same sums in another order


def _worst_error(grads: dict, reference: dict) -> float:
    """Largest over the parameters of max |g - g_ref| / max |g_ref|."""
    worst = 0.0
    for name, ref in reference.items():
        got = np.asarray(grads[name], dtype=np.float64)
        worst = max(worst, float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-300)))
    return worst


def _check(what: str, worst: float, tolerance: float) -> float:
    if not worst <= tolerance:
        raise KsaeError(f"benchmark validation failed: {what} gradients differ from the float64 dense step by "
                        f"{worst:.2e} (allowed {tolerance})")
    return worst


def _batch(D: int, C: int, batch_size: int, rng, dtype=np.float32):
    """MNIST-like rows (about 19% of pixels non-zero, in [0, 1]) and labels."""
    X_nd = rng.random((batch_size, D)) * (rng.random((batch_size, D)) < 0.19)
    return X_nd.astype(dtype), rng.integers(0, C, batch_size)


def _problem(D: int, hidden: list[int], C: int, batch_size: int, seed: int, dtype=np.float32):
    """A random net (std 0.05 weights, small random biases) and one batch."""
    rng = np.random.default_rng(seed)
    params = finetune.init_random(D, hidden, C, 0.05, rng, np.float64)
    for name in params:
        if name.startswith("b"):
            params[name] = rng.standard_normal(params[name].shape) * 0.01
    return ({n: v.astype(dtype) for n, v in params.items()}, *_batch(D, C, batch_size, rng, dtype))


def validate(D: int, hidden: list[int], C: int, kept: list[int], batch_size: int, topk_method: str) -> dict:
    """Worst relative gradient error of each step on one batch (raises :class:`KsaeError` past the tolerance)."""
    params64, X64, y_n = _problem(D, hidden, C, batch_size, seed=1, dtype=np.float64)
    _, dense64 = finetune.loss_and_grads(params64, X64, y_n, kept, topk_method=topk_method)
    _, sparse64 = loss_and_grads_sparse(params64, X64, y_n, kept, topk_method=topk_method)
    errors = {"sparse_float64": _check("float64 sparse step", _worst_error(sparse64, dense64), FLOAT64_TOLERANCE)}
    params32 = {n: v.astype(np.float32) for n, v in params64.items()}
    X32 = X64.astype(np.float32)
    _, dense32 = finetune.loss_and_grads(params32, X32, y_n, kept, topk_method=topk_method)
    errors["dense"] = _check("float32 dense step", _worst_error(dense32, dense64), FLOAT32_TOLERANCE)
    stored = dict(params32, W1_dh=sparse_layout(params32["W1_dh"]))
    _, sparse32 = loss_and_grads_sparse(stored, X32, y_n, kept, topk_method=topk_method, defer_weight_gradient=True)
    errors["sparse"] = _check("float32 sparse step", _worst_error(sparse32, dense64), FLOAT32_TOLERANCE)
    if cpu_kernels.enabled():
        with _cpu_kernels_setting("0"):
            _, scipy32 = loss_and_grads_sparse(params32, X32, y_n, kept, topk_method=topk_method)
        errors["sparse_scipy"] = _check("float32 sparse step without the CPU kernels",
                                        _worst_error(scipy32, dense64), FLOAT32_TOLERANCE)
    return errors


def _time_net(backend, D, hidden, C, kept, batch_size, topk_method, repeats, steps, log) -> dict:
    """Validate, then time every contender on one net; milliseconds per step (gradients and update)."""
    errors = validate(D, hidden, C, kept, batch_size, topk_method)
    host_params, _, _ = _problem(D, hidden, C, batch_size, seed=0)
    rng = np.random.default_rng(2)
    batches = [_batch(D, C, batch_size, rng) for _ in range(8)]  # several, so that no cache holds the one batch
    contenders = {"dense": (finetune.loss_and_grads, {}, None),
                  "sparse": (loss_and_grads_sparse, {"defer_weight_gradient": True}, None)}
    if cpu_kernels.enabled():
        contenders["sparse_scipy"] = (loss_and_grads_sparse, {}, "0")
    ms = {}
    for name, (fn, options, kernels_setting) in contenders.items():
        params = {n: v.copy() for n, v in host_params.items()}
        if fn is loss_and_grads_sparse:  # stored as the trainer stores it for the sparse step
            params["W1_dh"] = sparse_layout(params["W1_dh"])
        optimizer = MomentumSGD(params, 0.25, np)
        # The update the fine-tuning trainer chooses: on the CPU kernels fused, gradients in parts applied as such.
        update = cpu_momentum.parts_step if kernels_setting != "0" and cpu_kernels.enabled() else MomentumSGD.step

        def step(i, fn=fn, params=params, optimizer=optimizer, options=options, update=update):
            X_nd, y_n = batches[i % len(batches)]
            _, grads = fn(params, X_nd, y_n, kept, None, topk_method, **options)
            # lr = 0 does the update's arithmetic while keeping the weights (and the timing) from drifting.
            update(optimizer, params, grads, 0.0)

        with _cpu_kernels_setting(kernels_setting):
            ms[name] = 1e3 * _median_seconds(step, backend, repeats, steps)
    W1_dh = host_params["W1_dh"]
    ms["encoder_XW1"] = 1e3 * _median_seconds(lambda i: batches[i % len(batches)][0] @ W1_dh, backend, repeats, steps)
    ratios = {"dense_over_sparse": ms["dense"] / ms["sparse"], "sparse_over_encoder": ms["sparse"] / ms["encoder_XW1"]}
    if "sparse_scipy" in ms:
        ratios["sparse_scipy_over_sparse"] = ms["sparse_scipy"] / ms["sparse"]
    shape = "-".join(str(s) for s in (D, *hidden, C))
    log(f"{shape}: " + "  ".join(f"{name} {value:.3f} ms" for name, value in ms.items()) + "  |  "
        + "  ".join(f"{name} {value:.2f}" for name, value in ratios.items()))
    return {"shape": shape, "hidden": list(hidden), "kept": list(kept), "ms": ms, "ratios": ratios,
            "validation_max_rel_error": errors}


def bench_finetune_step(backend, D: int = 784, H: int = paper.HIDDEN, C: int = 10, kept: int = paper.KEPT,
                        layers=(1, 2), batch_size: int = paper.BATCH_SIZE, topk_method: str = "sort", repeats: int = 7, steps: int = 20,
                        threads: int | None = 1, log=print) -> dict:
    """Dense and sparse fine-tuning steps (phase ``all``) on a net of ``L`` hidden layers of ``H`` units
    for each ``L`` in ``layers``, every layer keeping ``kept`` units."""
    if backend.is_gpu:
        raise KsaeError("ksae-bench finetune times the CPU steps (the sparse fine-tuning step runs on NumPy only)")
    limit, limited = _thread_limit(threads)
    with backend.use(), limit:
        log(f"threads: {threads if limited else 'not limited (threadpoolctl missing)'} for BLAS and the CPU kernels")
        nets = [_time_net(backend, D, [H] * L, C, [kept] * L, batch_size, topk_method, repeats, steps, log)
                for L in layers]
    return {
        "benchmark": "finetune-step",
        "phase": "all",
        "shape": {"N": batch_size, "D": D, "H": H, "C": C, "kept": kept},
        "topk": topk_method,
        "threads": threads if limited else None,
        "cpu_kernel_threads": cpu_kernels.threads() if cpu_kernels.enabled() else None,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "nets": nets,
        "repeats": repeats, "steps_per_repeat": steps,
        "meta": run_metadata(backend),
    }
