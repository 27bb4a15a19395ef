"""``ksae-bench train``: speed of a whole training step against its matrix products alone.

One step on MNIST shapes (N=128, D=784, H=1000, k=25) is four dense products,
    Z = X W,  Xhat = Zs W^T,  dZs = R W,  dW = [X; R]^T [dZ; Zs],
plus the top-k, the gathers and scatters, and the optimiser update. The benchmark first
validates the step (float32 gradients against float64 ones on the same batch), then
times the whole step and the four products on the same shapes, in the same run, and
reports both and their ratio.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from ksae_cupy import model
from ksae_cupy.bench.metadata import run_metadata
from ksae_cupy.errors import KsaeError
from ksae_cupy.optim import MomentumSGD

VALIDATION_TOLERANCE = 1e-3  # float32 vs float64 gradients, relative to the largest entry


def _median_seconds(fn, backend, repeats: int, steps: int) -> float:
    """Median over ``repeats`` of the time per call of ``steps`` calls of ``fn(step)``."""
    fn(0)
    backend.synchronize()
    times = []
    for r in range(repeats):
        start = time.perf_counter()
        for s in range(steps):
            fn(r * steps + s)
        backend.synchronize()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def validate_step(backend, D: int, H: int, k: int, batch_size: int, topk_method: str) -> float:
    """Relative error of the float32 step's gradients against float64 on the same batch."""
    rng = np.random.default_rng(1)
    params64 = model.init_params(D, H, 0.05, rng, np.float64)
    X64 = rng.random((batch_size, D))
    _, grads64, _ = model.loss_and_grads(params64, X64, k, "sort")
    params32 = {name: backend.asarray(v, dtype=np.float32) for name, v in params64.items()}
    _, grads32, _ = model.loss_and_grads(params32, backend.asarray(X64, dtype=np.float32), k, topk_method)
    worst = 0.0
    for name in model.PARAM_NAMES:
        g32 = np.asarray(grads32[name].get() if backend.is_gpu else grads32[name], dtype=np.float64)
        worst = max(worst, float(np.max(np.abs(g32 - grads64[name])) / np.max(np.abs(grads64[name]))))
    if worst > VALIDATION_TOLERANCE:
        raise KsaeError(f"benchmark validation failed: float32 step gradients differ from float64 by {worst:.2e} "
                        f"(allowed {VALIDATION_TOLERANCE})")
    return worst


def bench_train_step(backend, D=784, H=1000, k=25, batch_size=128, topk_method="sort", repeats=7, steps=50,
                     log=print) -> dict:
    """Time the whole step and its four products; return a result dict (with metadata)."""
    xp = backend.xp
    with backend.use():
        error = validate_step(backend, D, H, k, batch_size, topk_method)
        log(f"validated: float32 step gradients within {error:.1e} of float64")
        rng = np.random.default_rng(0)
        params = {n: backend.asarray(v) for n, v in model.init_params(D, H, 0.01, rng, np.float32).items()}
        optimizer = MomentumSGD(params, 0.9, xp)
        # Rotate through several batches so no cache holds the one batch.
        batches = [backend.asarray(rng.random((batch_size, D), dtype=np.float32)) for _ in range(8)]

        def step(i):
            _, grads, _ = model.loss_and_grads(params, batches[i % 8], k, topk_method)
            # lr = 0 does the update's arithmetic while keeping the weights (and the
            # timing) from drifting over thousands of steps on random data.
            optimizer.step(params, grads, 0.0)

        W = params["W_dh"]
        Zs = backend.asarray(rng.random((batch_size, H), dtype=np.float32))
        R = backend.asarray(rng.random((batch_size, D), dtype=np.float32))

        def products(i):
            X = batches[i % 8]
            X @ W
            Zs @ W.T
            R @ W
            xp.concatenate([X, R]).T @ xp.concatenate([Zs, Zs])

        step_s = _median_seconds(step, backend, repeats, steps)
        products_s = _median_seconds(products, backend, repeats, steps)
    result = {
        "benchmark": "train-step",
        "shape": {"N": batch_size, "D": D, "H": H, "k": k},
        "topk": topk_method,
        "step_ms": step_s * 1e3,
        "matmul_ms": products_s * 1e3,
        "step_over_matmul": step_s / products_s,
        "samples_per_s": batch_size / step_s,
        "epoch_s_mnist": 50_000 / batch_size * step_s,
        "repeats": repeats, "steps_per_repeat": steps,
        "validation_max_rel_error": error,
        "meta": run_metadata(backend),
    }
    log(f"step {result['step_ms']:.3f} ms  ({result['samples_per_s']:,.0f} samples/s; "
        f"MNIST epoch {result['epoch_s_mnist']:.2f} s)")
    log(f"matrix products alone {result['matmul_ms']:.3f} ms; step / products = {result['step_over_matmul']:.2f}")
    return result
