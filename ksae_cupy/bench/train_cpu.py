"""``ksae-bench train``: the dense step, the sparse step, PyTorch, and the encoder product alone;
and, with ``--epoch-k``, whole epochs and their parts.

One step on MNIST shapes (N=128, D=784, H=1000, k=25). The dense step
(:func:`ksae_cupy.model.loss_and_grads`) does five dense products' worth of work; the sparse
step (:mod:`ksae_cupy.sparse_step`) keeps only the encoder product ``X W`` dense, so ``X W``
alone is the floor it is compared against. When torch imports, a PyTorch eager step of the
same math (``torch.topk``, ``scatter``, autograd, ``torch.optim.SGD`` with momentum) runs in
the same process with the same thread count.

Every step is validated first (float32 gradients against the float64 dense reference on one
batch), then each is timed as the median of ``repeats`` repeats of ``steps`` steps.
BLAS (and torch) threads are limited to ``threads`` for every contender when threadpoolctl
is installed; the result says whether the limit was applied.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time

import numpy as np

from ksae_cupy import model
from ksae_cupy.bench.metadata import run_metadata
from ksae_cupy.cpu import kernels as cpu_kernels
from ksae_cupy.errors import KsaeError
from ksae_cupy.optim import MomentumSGD
from ksae_cupy.sparse_step import loss_and_grads_sparse, sparse_layout

VALIDATION_TOLERANCE = 1e-3  # float32 vs float64 gradients, relative to the largest entry
STEPS = {"dense": model.loss_and_grads, "sparse": loss_and_grads_sparse}


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


def _reference_problem(D: int, H: int, batch_size: int):
    rng = np.random.default_rng(1)
    return model.init_params(D, H, 0.05, rng, np.float64), rng.random((batch_size, D))


def _worst_error(grads32: dict, grads64: dict) -> float:
    worst = 0.0
    for name in model.PARAM_NAMES:
        g32 = np.asarray(grads32[name], dtype=np.float64)
        worst = max(worst, float(np.max(np.abs(g32 - grads64[name])) / np.max(np.abs(grads64[name]))))
    return worst


def _check(what: str, worst: float) -> float:
    if worst > VALIDATION_TOLERANCE:
        raise KsaeError(f"benchmark validation failed: {what} gradients differ from float64 by {worst:.2e} "
                        f"(allowed {VALIDATION_TOLERANCE})")
    return worst


def validate_step(backend, D: int, H: int, k: int, batch_size: int, topk_method: str, step=model.loss_and_grads,
                  what: str = "float32 step") -> float:
    """Relative error of a float32 step's gradients against the float64 dense reference."""
    params64, X64 = _reference_problem(D, H, batch_size)
    _, grads64, _ = model.loss_and_grads(params64, X64, k, "sort")
    params32 = {name: backend.asarray(v, dtype=np.float32) for name, v in params64.items()}
    _, grads32, _ = step(params32, backend.asarray(X64, dtype=np.float32), k, topk_method)
    host = {name: g.get() if backend.is_gpu else g for name, g in grads32.items()}
    return _check(what, _worst_error(host, grads64))


@contextlib.contextmanager
def _cpu_kernels_setting(setting: str | None):
    """``KSAE_CPU_KERNELS`` set to ``setting`` inside the block (unchanged for None)."""
    saved = os.environ.get("KSAE_CPU_KERNELS")
    if setting is not None:
        os.environ["KSAE_CPU_KERNELS"] = setting
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("KSAE_CPU_KERNELS", None)
        else:
            os.environ["KSAE_CPU_KERNELS"] = saved


def _thread_limit(threads: int | None):
    """A context limiting BLAS threads (threadpoolctl, when installed); and whether it applies.
    The CPU kernels get the same count (as ``--threads`` gives them in training)."""
    if threads is None:
        return contextlib.nullcontext(), False
    cpu_kernels.set_threads(threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext(), False
    return threadpool_limits(limits=threads), True


def time_epoch(backend, D: int, H: int, k: int, batch_size: int, topk_method: str, n_train: int = 50_000,
               n_valid: int = 10_000, log=print) -> dict:
    """One training epoch as ``ksae-train`` runs it, on MNIST-shaped uniform random data, with its parts.

    The trainer's own part timings (shuffle, batch gathering, steps, updates, validation pass), then
    what the command adds per epoch: a metrics line, and a checkpoint (every 10 epochs by default).
    Random data costs what MNIST costs: every part's work depends on the shapes and k, not the values.
    """
    import tempfile
    from pathlib import Path

    from ksae_cupy.training.checkpoint import save_checkpoint
    from ksae_cupy.training.runs import RunFolder
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    rng = np.random.default_rng(0)

    def mnist_like(n):  # about MNIST's 19% of non-zero pixels in [0, 1]
        return (rng.random((n, D), dtype=np.float32) * (rng.random((n, D)) < 0.19)).astype(np.float32)

    X_train, X_valid = backend.asarray(mnist_like(n_train)), backend.asarray(mnist_like(n_valid))
    # A small rate keeps random data from diverging; the rate does not change a step's work.
    trainer = Trainer(TrainConfig(hidden=H, k=k, k_start=None, epochs=2, batch_size=batch_size, topk=topk_method,
                                  lr=1e-3), backend, D)
    trainer.run_epoch(X_train[:4 * batch_size], X_valid[:batch_size])  # compiles the kernels; not timed
    trainer.epoch = 0
    start = time.perf_counter()
    report = trainer.run_epoch(X_train, X_valid)
    total = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        folder = RunFolder(Path(tmp) / "run")
        folder.create(log=lambda *_: None)
        t0 = time.perf_counter()
        folder.append_metrics(report)
        t1 = time.perf_counter()
        save_checkpoint(Path(tmp) / "checkpoint.h5", trainer.checkpoint())
        t2 = time.perf_counter()
    parts = dict(report.parts, metrics_line=round(t1 - t0, 4), checkpoint=round(t2 - t1, 4))
    result = {"k": k, "n_train": n_train, "n_valid": n_valid, "epoch_s": round(total, 3),
              "epoch_with_checkpoint_every_10_s": round(total + parts["metrics_line"] + parts["checkpoint"] / 10, 3),
              "steps_s": round(report.parts["steps"] + report.parts["updates"], 3), "parts_s": parts}
    log(f"epoch at k={k}: {total:.2f} s (steps and updates {result['steps_s']:.2f} s); parts: "
        + ", ".join(f"{name} {value:.3f}" for name, value in parts.items()))
    return result


def _torch_step(D: int, H: int, k: int, batch_size: int, threads: int | None, batches_np, params_np):
    """A PyTorch eager step of the same math, validated; None when torch does not import."""
    try:
        import torch
    except ImportError:
        return None, None
    if threads is not None:
        torch.set_num_threads(threads)

    def grads_of(params, X):
        W, b, c = params
        Z = X @ W + b
        val, idx = torch.topk(Z, k, dim=1)
        Zs = torch.zeros_like(Z).scatter(1, idx, val)
        R = Zs @ W.T + c - X
        loss = 0.5 * (R * R).sum() / X.shape[0]
        loss.backward()
        return loss

    params64, X64 = _reference_problem(D, H, batch_size)
    _, grads64, _ = model.loss_and_grads(params64, X64, k, "sort")
    tp = [torch.tensor(params64[n], dtype=torch.float32, requires_grad=True) for n in model.PARAM_NAMES]
    grads_of(tp, torch.tensor(X64, dtype=torch.float32))
    error = _check("PyTorch step", _worst_error({n: p.grad.numpy() for n, p in zip(model.PARAM_NAMES, tp)}, grads64))

    params = [torch.tensor(params_np[n], requires_grad=True) for n in model.PARAM_NAMES]
    optimizer = torch.optim.SGD(params, lr=0.0, momentum=0.9)
    batches = [torch.from_numpy(X) for X in batches_np]

    def step(i):
        optimizer.zero_grad(set_to_none=False)
        grads_of(params, batches[i % len(batches)])
        optimizer.step()

    return step, {"torch": torch.__version__, "torch_threads": torch.get_num_threads(), "validation": error}


def _time_at_k(backend, D, H, k, batch_size, topk_method, repeats, steps, threads, with_torch: bool, log) -> dict:
    """Validate then time every contender at one k; milliseconds per step."""
    xp = backend.xp
    errors = {name: validate_step(backend, D, H, k, batch_size, topk_method, fn, f"{name} step")
              for name, fn in STEPS.items()}
    if not backend.is_gpu and cpu_kernels.enabled():
        with _cpu_kernels_setting("0"):
            errors["sparse_scipy"] = validate_step(backend, D, H, k, batch_size, topk_method, loss_and_grads_sparse,
                                                   "sparse step without the CPU kernels")
    rng = np.random.default_rng(0)
    host_params = model.init_params(D, H, 0.01, rng, np.float32)
    # Rotate through several batches so no cache holds the one batch.
    host_batches = [rng.random((batch_size, D), dtype=np.float32) for _ in range(8)]
    batches = [backend.asarray(X) for X in host_batches]
    ms = {}
    # The sparse step as the trainer runs it: W in Fortran order, W's gradient handed to the
    # optimizer in parts. On the CPU with the Numba kernels, also the same step without them.
    contenders = {"dense": (model.loss_and_grads, {}, None),
                  "sparse": (loss_and_grads_sparse, {"defer_weight_gradient": True}, None)}
    if not backend.is_gpu and cpu_kernels.enabled():
        contenders["sparse_scipy"] = (loss_and_grads_sparse, {}, "0")
    for name, (fn, options, kernels_setting) in contenders.items():
        params = {n: backend.asarray(v.copy()) for n, v in host_params.items()}
        if fn is loss_and_grads_sparse:  # stored as the trainer stores it for the sparse step
            params["W_dh"] = sparse_layout(params["W_dh"])
        optimizer = MomentumSGD(params, 0.9, xp)

        def step(i, fn=fn, params=params, optimizer=optimizer, options=options):
            _, grads, _ = fn(params, batches[i % 8], k, topk_method, **options)
            # lr = 0 does the update's arithmetic while keeping the weights (and the
            # timing) from drifting over thousands of steps on random data.
            optimizer.step(params, grads, 0.0)

        with _cpu_kernels_setting(kernels_setting):
            ms[name] = 1e3 * _median_seconds(step, backend, repeats, steps)
    W = backend.asarray(host_params["W_dh"])
    ms["encoder_XW"] = 1e3 * _median_seconds(lambda i: batches[i % 8] @ W, backend, repeats, steps)
    torch_info = None
    if with_torch:
        torch_step, torch_info = _torch_step(D, H, k, batch_size, threads, host_batches, host_params)
        if torch_step is not None:
            errors["torch"] = torch_info.pop("validation")
            ms["torch"] = 1e3 * _median_seconds(torch_step, backend, repeats, steps)
    ratios = {"dense_over_sparse": ms["dense"] / ms["sparse"],
              "sparse_over_encoder": ms["sparse"] / ms["encoder_XW"]}
    if "sparse_scipy" in ms:
        ratios["sparse_scipy_over_sparse"] = ms["sparse_scipy"] / ms["sparse"]
    if "torch" in ms:
        ratios["torch_over_sparse"] = ms["torch"] / ms["sparse"]
    line = "  ".join(f"{name} {value:.3f} ms" for name, value in ms.items())
    log(f"k={k}: {line}  |  " + "  ".join(f"{name} {value:.2f}" for name, value in ratios.items()))
    return {"k": k, "ms": ms, "ratios": ratios, "validation_max_rel_error": errors, "torch": torch_info}


def bench_train_step(backend, D=784, H=1000, k=25, batch_size=128, topk_method="sort", repeats=7, steps=50,
                     threads: int | None = 1, k_sweep=(), with_torch: bool = True, epoch_ks=(), log=print) -> dict:
    """Dense step, sparse step, PyTorch and ``X W`` alone at ``k`` (and each k of ``k_sweep``);
    then, for each k of ``epoch_ks``, a whole MNIST-sized epoch and its parts (:func:`time_epoch`)."""
    limit, limited = _thread_limit(threads)
    with backend.use(), limit:
        log(f"threads: {threads if limited else 'not limited (threadpoolctl missing)'} for every contender")
        main = _time_at_k(backend, D, H, k, batch_size, topk_method, repeats, steps, threads, with_torch, log)
        sweep = [_time_at_k(backend, D, H, kk, batch_size, topk_method, repeats, steps, threads, with_torch, log)
                 for kk in k_sweep]
        epochs = [time_epoch(backend, D, H, kk, batch_size, topk_method, log=log) for kk in epoch_ks]
    result = {
        "benchmark": "train-step",
        "shape": {"N": batch_size, "D": D, "H": H, "k": k},
        "topk": topk_method,
        "threads": threads if limited else None,
        "cpu_kernel_threads": cpu_kernels.threads() if cpu_kernels.enabled() else None,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        **main,
        "epoch_s_mnist": {name: 50_000 / batch_size * value / 1e3 for name, value in main["ms"].items()},
        "k_sweep": sweep,
        "sparse_stops_winning_at_k": next((r["k"] for r in sweep if r["ratios"]["dense_over_sparse"] < 1), None),
        "epochs": epochs,
        "repeats": repeats, "steps_per_repeat": steps,
        "meta": run_metadata(backend),
    }
    log(f"MNIST epoch (50,000 images): dense {result['epoch_s_mnist']['dense']:.2f} s, "
        f"sparse {result['epoch_s_mnist']['sparse']:.2f} s; load average {result['load_average']}")
    return result
