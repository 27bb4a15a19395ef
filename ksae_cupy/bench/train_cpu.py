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

The encoder side by side (:func:`compare_encoders`, ``--encoder``): on MNIST batches (the real
training images when they load, else random ones with MNIST's 19% of non-zeros), the sparse step with
BLAS's ``X W`` and with ``X W`` from the non-zero inputs (:mod:`ksae_cupy.cpu.sparse_encoder`), each
with its momentum update, interleaved repeat by repeat with ``X W`` alone so that a shared machine's
load falls on all of them alike; and, with ``--epoch-k``, whole epochs with each encoder, interleaved.
BLAS (and torch) threads are limited to ``threads`` for every contender when threadpoolctl
is installed; the result says whether the limit was applied.

Over 400 lines: the CPU training benchmarks (a step, an epoch, the encoders, the step's parts) share their
reference checks, thread limits and timing, so that every figure is taken alike.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time

import numpy as np

from ksae_cupy import model, paper
from ksae_cupy.bench.metadata import run_metadata
from ksae_cupy.cpu import numba_kernels as cpu_kernels
from ksae_cupy.cpu import momentum as cpu_momentum
from ksae_cupy.cpu.numba_kernels import _compiled, _kernel
from ksae_cupy.cpu import sparse_encoder
from ksae_cupy.errors import KsaeError
from ksae_cupy.momentum_sgd import MomentumSGD
from ksae_cupy.sparse_step import loss_and_grads_sparse, sparse_layout

prange = range  # numba.prange once a kernel here is compiled (set by cpu.numba_kernels._compiled)
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


def _blas_threads(count: int):
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=count, user_api="blas")


def mnist_inputs(D: int, n_train: int = 50_000, n_valid: int = 10_000):
    """``(X_train, X_valid, what)``: MNIST's training and validation images (float32) when ``D`` is 784 and
    they load from ``$KSAE_DATA_DIR``, else random ones with MNIST's 19% of non-zero pixels in [0, 1]."""
    if D == 784:
        from ksae_cupy.datasets import data_root
        from ksae_cupy.datasets.registry import load_mnist

        try:
            data = load_mnist(data_root(), log=lambda *_: None)
            X_train = np.ascontiguousarray(data.X_train[:n_train], dtype=np.float32)
            X_valid = np.ascontiguousarray(data.X_valid[:n_valid], dtype=np.float32)
            return X_train, X_valid, f"MNIST ({X_train.shape[0]:,} training, {X_valid.shape[0]:,} validation images)"
        except (KsaeError, OSError):
            pass
    rng = np.random.default_rng(0)

    def mnist_like(n):
        return (rng.random((n, D), dtype=np.float32) * (rng.random((n, D)) < 0.19)).astype(np.float32)

    return mnist_like(n_train), mnist_like(n_valid), "random, MNIST's 19% of non-zeros (MNIST did not load)"


@contextlib.contextmanager
def _encoder_setting(encoder: str | None):
    """``KSAE_ENCODER`` set to ``encoder`` inside the block (unchanged for None)."""
    saved = os.environ.get("KSAE_ENCODER")
    if encoder is not None:
        os.environ["KSAE_ENCODER"] = encoder
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("KSAE_ENCODER", None)
        else:
            os.environ["KSAE_ENCODER"] = saved


def time_epoch(backend, D: int, H: int, k: int, batch_size: int, topk_method: str, n_train: int = 50_000,
               n_valid: int = 10_000, log=print, inputs=None, encoders=(None,), repeats: int = 1, trained=None) -> dict:
    """One training epoch as ``ksae-train`` runs it, on MNIST (:func:`mnist_inputs`), with its parts.

    ``trained`` (:class:`ksae_cupy.bench.trained.TrainedStart`): the epochs continue that trained model at its
    own rate; None: a fresh model (at the paper's rate on MNIST; at 1e-3 on random rows, which diverge at it).

    The trainer's own part timings (shuffle, batch gathering, steps, updates, validation pass), then
    what the command adds per epoch: a metrics line, and a checkpoint (every 10 epochs by default).
    ``encoders``: ``KSAE_ENCODER`` settings to time side by side (None: the process's own), each in a
    trainer of its own, their epochs interleaved ``repeats`` times (medians); the first is reported
    as the epoch, every one under ``by_encoder``.
    """
    import tempfile
    from pathlib import Path

    from ksae_cupy.training.checkpoint import save_checkpoint
    from ksae_cupy.session.runs import RunFolder
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    X_train, X_valid, what = inputs if inputs is not None else mnist_inputs(D, n_train, n_valid)
    X_train, X_valid = backend.asarray(X_train), backend.asarray(X_valid)
    n_train, n_valid = X_train.shape[0], X_valid.shape[0]
    trainers, seconds, reports = {}, {encoder: [] for encoder in encoders}, {}
    for encoder in encoders:
        with _encoder_setting(encoder):
            if trained is None:
                lr = paper.LR if what.startswith("MNIST") else 1e-3
                trainer = Trainer(TrainConfig(hidden=H, k=k, k_start=None, epochs=repeats + 1, batch_size=batch_size,
                                              topk=topk_method, lr=lr), backend, D)
            else:
                trainer = trained.trainer(backend, D, k, repeats + 1)
            first_epoch = trainer.epoch
            trainer.run_epoch(X_train[:4 * batch_size], X_valid[:batch_size])  # compiles the kernels; not timed
            trainer.epoch = first_epoch
            # The sets' spread (the FVE's denominators), computed once per set by the trainer: not timed.
            trainer._spreads.of(X_train), trainer._spreads.of(X_valid)
            trainers[encoder] = trainer
    for _ in range(repeats):
        for encoder, trainer in trainers.items():
            with _encoder_setting(encoder):
                start = time.perf_counter()
                report = trainer.run_epoch(X_train, X_valid)
                seconds[encoder].append(time.perf_counter() - start)
            reports.setdefault(encoder, []).append(report)
    by_encoder = {}
    for encoder in encoders:
        runs = reports[encoder]
        middle = sorted(range(len(runs)), key=lambda i: seconds[encoder][i])[len(runs) // 2]
        by_encoder[encoder or "process setting"] = {
            "epoch_s": round(statistics.median(seconds[encoder]), 3),
            "steps_s": round(statistics.median(r.parts["steps"] + r.parts["updates"] for r in runs), 3),
            "validation_s": round(statistics.median(r.parts["validation"] for r in runs), 3),
            "epochs_s": [round(t, 3) for t in seconds[encoder]], "parts_s_of_median_epoch": runs[middle].parts}
    first = encoders[0]
    trainer, total = trainers[first], statistics.median(seconds[first])
    report = reports[first][sorted(range(repeats), key=lambda i: seconds[first][i])[repeats // 2]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = RunFolder(Path(tmp) / "run")
        folder.create(log=lambda *_: None)
        t0 = time.perf_counter()
        folder.append_metrics(report)
        t1 = time.perf_counter()
        save_checkpoint(Path(tmp) / "checkpoint.h5", trainer.checkpoint())
        t2 = time.perf_counter()
    parts = dict(report.parts, metrics_line=round(t1 - t0, 4), checkpoint=round(t2 - t1, 4))
    result = {"k": k, "n_train": n_train, "n_valid": n_valid, "inputs": what, "encoder": first or "process setting",
              "model": "fresh" if trained is None else trained.made, "lr": float(trainer.config.lr),
              "dead_fraction": report.dead_fraction,
              "epoch_s": round(total, 3),
              "epoch_with_checkpoint_every_10_s": round(total + parts["metrics_line"] + parts["checkpoint"] / 10, 3),
              "steps_s": round(report.parts["steps"] + report.parts["updates"], 3), "parts_s": parts}
    log(f"epoch at k={k}, {result['model']} model: {total:.2f} s (steps and updates {result['steps_s']:.2f} s); parts: "
        + ", ".join(f"{name} {value:.3f}" for name, value in parts.items()))
    if len(encoders) > 1:
        result["by_encoder"] = by_encoder
        log(f"epoch at k={k} by encoder ({what}; medians of {repeats}, interleaved): "
            + ", ".join(f"{name} {value['epoch_s']:.3f} s (steps {value['steps_s']:.3f}, validation "
                        f"{value['validation_s']:.3f})" for name, value in by_encoder.items()))
    return result


def _torch_step(D: int, H: int, k: int, batch_size: int, threads: int | None, batches_np, params_np,
                velocities_np=None, lr: float = 0.0, momentum: float = paper.MOMENTUM):
    """A PyTorch eager step of the same math, validated; None when torch does not import. ``velocities_np``:
    our velocities ``v`` of a trained model, given to ``torch.optim.SGD`` as its momentum buffers ``-v / lr``
    (its ``buf <- m buf + g; p <- p - lr buf`` is our update with ``v = -lr buf``). Its timing runs with
    denormals flushed (``torch.set_flush_denormal``, :func:`_torch_flushing`), as our updates flush them."""
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

    params = [torch.tensor(np.ascontiguousarray(params_np[n]), requires_grad=True) for n in model.PARAM_NAMES]
    optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum)
    if velocities_np is not None and lr > 0:
        for p, n in zip(params, model.PARAM_NAMES):
            optimizer.state[p]["momentum_buffer"] = torch.tensor(-np.asarray(velocities_np[n]) / np.float32(lr))
    batches = [torch.from_numpy(X) for X in batches_np]

    def step(i):
        optimizer.zero_grad(set_to_none=False)
        grads_of(params, batches[i % len(batches)])
        optimizer.step()

    return step, {"torch": torch.__version__, "torch_threads": torch.get_num_threads(), "validation": error}


@contextlib.contextmanager
def _torch_flushing(info: dict):
    """Denormals flushed to zero for torch inside the block (``torch.set_flush_denormal``: the FTZ and DAZ bits
    of this thread), as our updates flush them; off again after, so nothing else in the process runs so."""
    import torch

    info["flush_denormal"] = bool(torch.set_flush_denormal(True))
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _time_at_k(backend, D, H, k, batch_size, topk_method, repeats, steps, threads, with_torch: bool, log,
               start=None, inputs=None) -> dict:
    """Validate then time every contender at one k; milliseconds per step.

    ``start`` (:class:`ksae_cupy.bench.trained.TrainedStart`) and ``inputs`` (:func:`mnist_inputs`): every
    contender steps from that trained model's parameters and velocities, on batches of those inputs, at its rate
    (what a user's run does); else from initial weights on random batches at rate 0 (the update's arithmetic,
    the weights kept)."""
    xp = backend.xp
    errors = {name: validate_step(backend, D, H, k, batch_size, topk_method, fn, f"{name} step")
              for name, fn in STEPS.items()}
    if not backend.is_gpu and cpu_kernels.enabled():
        with _cpu_kernels_setting("0"):
            errors["sparse_scipy"] = validate_step(backend, D, H, k, batch_size, topk_method, loss_and_grads_sparse,
                                                   "sparse step without the CPU kernels")
    rng = np.random.default_rng(0)
    if start is None:
        host_params = model.init_params(D, H, 0.01, rng, np.float32)
        host_velocities, lr, momentum = None, 0.0, paper.MOMENTUM
        # Rotate through several batches so no cache holds the one batch.
        host_batches = [rng.random((batch_size, D), dtype=np.float32) for _ in range(8)]
    else:
        host_params, host_velocities = start.host_state()
        config = start.config(k, 1)
        lr, momentum = float(config.lr), float(config.momentum)
        X_train = inputs[0]
        host_batches = [np.ascontiguousarray(X_train[rng.choice(len(X_train), batch_size, replace=False)],
                                             dtype=np.float32) for _ in range(8)]
    batches = [backend.asarray(X) for X in host_batches]
    ms = {}
    # The sparse step as the trainer runs it: W in Fortran order, W's gradient handed to the
    # optimizer in parts. On the CPU with the Numba kernels, also the same step without them.
    lanes = threads if (threads or 1) > 1 and not backend.is_gpu and cpu_kernels.enabled() else 1
    contenders = {"dense": (model.loss_and_grads, {}, None),
                  "sparse": (loss_and_grads_sparse, {"defer_weight_gradient": True, "lanes": lanes}, None)}
    if not backend.is_gpu and cpu_kernels.enabled():
        contenders["sparse_scipy"] = (loss_and_grads_sparse, {}, "0")
    for name, (fn, options, kernels_setting) in contenders.items():
        params = {n: backend.asarray(v.copy()) for n, v in host_params.items()}
        if fn is loss_and_grads_sparse:  # stored as the trainer stores it for the sparse step
            params["W_dh"] = sparse_layout(params["W_dh"])
        optimizer = MomentumSGD(params, momentum, xp)
        for n, v in (host_velocities or {}).items():
            optimizer.velocities[n][...] = backend.asarray(v)
        # The update the trainer chooses (ksae_cupy.training.steps): on the CPU kernels fused, and for the
        # sparse step W's gradient applied row by row.
        kernels = not backend.is_gpu and kernels_setting != "0" and cpu_kernels.enabled()
        update = (MomentumSGD.step if not kernels else
                  cpu_momentum.rows_step if options.get("defer_weight_gradient") else cpu_momentum.fused_step)

        def step(i, fn=fn, params=params, optimizer=optimizer, options=options, update=update):
            _, grads, _ = fn(params, batches[i % 8], k, topk_method, **options)
            # Fresh: lr = 0 does the update's arithmetic while keeping the weights (and the timing) from
            # drifting over thousands of steps on random data. Trained: the run's rate, on its data.
            update(optimizer, params, grads, lr)

        # The sparse step in lanes runs BLAS on one thread beside them, as the trainer does.
        blas = _blas_threads(1) if options.get("lanes", 1) > 1 else contextlib.nullcontext()
        with _cpu_kernels_setting(kernels_setting), blas:
            ms[name] = 1e3 * _median_seconds(step, backend, repeats, steps)
    W = backend.asarray(host_params["W_dh"])
    ms["encoder_XW"] = 1e3 * _median_seconds(lambda i: batches[i % 8] @ W, backend, repeats, steps)
    torch_info = None
    if with_torch:
        torch_step, torch_info = _torch_step(D, H, k, batch_size, threads, host_batches, host_params,
                                             host_velocities, lr, momentum)
        if torch_step is not None:
            errors["torch"] = torch_info.pop("validation")
            with _torch_flushing(torch_info):
                ms["torch"] = 1e3 * _median_seconds(torch_step, backend, repeats, steps)
    ratios = {"dense_over_sparse": ms["dense"] / ms["sparse"],
              "sparse_over_encoder": ms["sparse"] / ms["encoder_XW"]}
    if "sparse_scipy" in ms:
        ratios["sparse_scipy_over_sparse"] = ms["sparse_scipy"] / ms["sparse"]
    if "torch" in ms:
        ratios["torch_over_sparse"] = ms["torch"] / ms["sparse"]
    line = "  ".join(f"{name} {value:.3f} ms" for name, value in ms.items())
    model_made = "fresh" if start is None else start.made
    log(f"k={k}, {model_made} model: {line}  |  " + "  ".join(f"{name} {value:.2f}" for name, value in ratios.items()))
    return {"k": k, "model": model_made, "lr": lr, "ms": ms, "ratios": ratios, "validation_max_rel_error": errors,
            "torch": torch_info}


# ---- The encoder side by side: BLAS's X W and X W from the non-zero inputs ----

# After a product on several threads, OpenBLAS's worker threads spin (sched_yield) for about 2^28
# cycles (0.1 s at 2.6 GHz; OPENBLAS_THREAD_TIMEOUT) before they sleep. A contender timed in lanes
# right after ``X W`` on two BLAS threads shared its cores with that spinner, which the trainer's
# epochs never do (BLAS runs on one thread beside the lanes). The pause is not timed.
BLAS_SPIN_PAUSE_S = 0.3
# Then each contender runs this many calls untimed before its timed block. Measured (the quiet 2-core machine,
# per-step times of the step in two lanes): right after X W on two BLAS threads the first ~70 steps took
# 2.5-3 ms against 1.4 ms (the spinner); after the pause, still the first ~5 (2.0-2.7 ms: a core idle for
# 0.3 s wakes slowly). A timed block of 50 steps starting cold had a median of 1.6-2.5 ms;
# the trainer's epoch runs its 391 steps back to back (1.43 ms each, from its epoch time). Every contender
# gets the same lead-in, ``X W`` alone too.
LEAD_IN_CALLS = 20


def _let_blas_threads_sleep() -> None:
    time.sleep(BLAS_SPIN_PAUSE_S)


def _encoder_runs_sparse(encoder: str, density: float) -> bool:
    return sparse_encoder.takes_sparse_encoder(density, encoder)


def compare_encoders(D: int, H: int, k: int, batch_size: int, topk_method: str, threads: int | None, encoders,
                     repeats: int, steps: int, inputs, log=print) -> dict:
    """The sparse step and its momentum update as the trainer runs them, with each encoder of ``encoders``
    (``dense``: BLAS's ``X W``; ``sparse``: from the non-zero inputs; ``auto``: by the inputs' density),
    beside ``X W`` alone (BLAS on ``threads`` threads: the floor the goal is stated against), on batches of
    ``inputs`` (:func:`mnist_inputs`). Validated first; then timed interleaved: every repeat times ``steps``
    steps of each contender in turn after :data:`LEAD_IN_CALLS` untimed calls (milliseconds, medians over repeats; ratios are medians of each repeat's)."""
    from ksae_cupy.cpu.lanes import lanes as lanes_of  # noqa: F401 (the lanes start before timing)

    X_train, _, what = inputs
    lanes = max(1, threads or 1)
    rng = np.random.default_rng(0)
    sparse_X = sparse_encoder.SparseInputs.of(X_train)
    row_ids = [rng.choice(X_train.shape[0], batch_size, replace=False) for _ in range(8)]
    batches = [np.ascontiguousarray(X_train[r]) for r in row_ids]
    rows = [sparse_X.rows(r) for r in row_ids]
    sparse_of = {encoder: _encoder_runs_sparse(encoder, sparse_X.density) for encoder in encoders}

    # Validation: each step's float32 gradients on a batch of these inputs against the float64 dense reference.
    params64 = model.init_params(D, H, 0.05, np.random.default_rng(1), np.float64)
    _, grads64, _ = model.loss_and_grads(params64, batches[0].astype(np.float64), k, "sort")
    params32 = {name: value.astype(np.float32) for name, value in params64.items()}
    params32["W_dh"] = sparse_layout(params32["W_dh"])
    errors = {}
    with _blas_threads(1 if lanes > 1 else lanes):
        for encoder in encoders:
            _, grads32, _ = loss_and_grads_sparse(params32, batches[0], k, topk_method, lanes=lanes,
                                                  X_rows=rows[0] if sparse_of[encoder] else None)
            errors[f"step_{encoder}_encoder"] = _check(f"sparse step with the {encoder} encoder",
                                                       _worst_error(grads32, grads64))
        Z_blas = cpu_kernels.encode(params32["W_dh"], params32["b_h"], batches[0], lanes)
        Z_sparse = sparse_encoder.encode_rows(rows[0], params32["W_dh"], params32["b_h"], lanes)
    errors["XW_sparse_against_blas"] = float(np.max(np.abs(Z_sparse - Z_blas)) / np.max(np.abs(Z_blas)))

    host_params = model.init_params(D, H, 0.01, np.random.default_rng(0), np.float32)
    W_dh = host_params["W_dh"]
    contenders = {"XW_alone_blas": (lambda i: batches[i % 8] @ W_dh, lanes)}  # (call, BLAS threads)
    for encoder in encoders:
        params = {name: value.copy() for name, value in host_params.items()}
        params["W_dh"] = sparse_layout(params["W_dh"])
        optimizer = MomentumSGD(params, 0.9, np)
        X_rows = rows if sparse_of[encoder] else [None] * 8

        def step(i, params=params, optimizer=optimizer, X_rows=X_rows):
            _, grads, _ = loss_and_grads_sparse(params, batches[i % 8], k, topk_method, defer_weight_gradient=True,
                                                lanes=lanes, X_rows=X_rows[i % 8])
            cpu_momentum.rows_step(optimizer, params, grads, 0.0)  # lr 0: the arithmetic, weights kept

        contenders[f"step_{encoder}_encoder"] = (step, 1 if lanes > 1 else lanes)
        if sparse_of[encoder]:
            contenders[f"XW_{encoder}_encoder"] = (
                lambda i, params=params: sparse_encoder.encode_rows(rows[i % 8], params["W_dh"], params["b_h"], lanes),
                1 if lanes > 1 else lanes)
        else:
            contenders[f"XW_{encoder}_encoder"] = (
                lambda i, params=params: cpu_kernels.encode(params["W_dh"], params["b_h"], batches[i % 8], lanes),
                1 if lanes > 1 else lanes)
    times = {name: [] for name in contenders}
    for r in range(repeats + 1):  # the first round compiles and warms caches: not counted
        for name, (call, blas) in contenders.items():
            with _blas_threads(blas):
                for s in range(LEAD_IN_CALLS):
                    call(s)
                start = time.perf_counter()
                for s in range(steps):
                    call(r * steps + s)
                seconds = (time.perf_counter() - start) / steps
            if blas > 1:
                _let_blas_threads_sleep()
            if r:
                times[name].append(seconds)
    ms = {name: 1e3 * statistics.median(values) for name, values in times.items()}

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    ratios = {f"step_{encoder}_encoder_over_XW": ratio(f"step_{encoder}_encoder", "XW_alone_blas")
              for encoder in encoders}
    if "dense" in encoders and len(encoders) > 1:
        for encoder in encoders:
            if encoder != "dense":
                ratios[f"step_dense_over_step_{encoder}"] = ratio("step_dense_encoder", f"step_{encoder}_encoder")
                ratios[f"XW_dense_over_XW_{encoder}"] = ratio("XW_dense_encoder", f"XW_{encoder}_encoder")
    result = {"inputs": what, "density": sparse_X.density, "threads": lanes, "encoders": list(encoders),
              "sparse_encoder_runs": sparse_of, "max_density_for_sparse": sparse_encoder.MAX_DENSITY,
              "ms": ms, "ratios": ratios, "validation_max_rel_error": errors, "repeats": repeats,
              "steps_per_repeat": steps, "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    log(f"encoders at {lanes} thread(s), k={k}, {what} (density {sparse_X.density:.3f}), interleaved: "
        + "  ".join(f"{name} {value:.3f} ms" for name, value in ms.items()) + "  |  "
        + "  ".join(f"{name} {value:.2f}" for name, value in ratios.items()))
    return result


SWEEP_DENSITIES = (0.1, 0.2, 0.3, 0.4, 0.5)


def encoder_density_sweep(D: int, H: int, batch_size: int, threads: int | None, repeats: int, steps: int,
                          densities=SWEEP_DENSITIES, log=print) -> dict:
    """``X W + b`` from the non-zero inputs against BLAS's (both in ``threads`` lanes, BLAS on one thread
    beside them, as the trainer runs them) on random inputs of each density: where
    :data:`ksae_cupy.cpu.sparse_encoder.MAX_DENSITY` should sit. Interleaved; ratios are medians of each
    repeat's ``sparse / BLAS``."""
    lanes = max(1, threads or 1)
    rng = np.random.default_rng(2)
    W_dh = sparse_layout(model.init_params(D, H, 0.01, rng, np.float32)["W_dh"])
    b_h = np.zeros(H, dtype=np.float32)
    rows = []
    for density in densities:
        X_nd = (rng.random((8 * batch_size, D), dtype=np.float32) * (rng.random((8 * batch_size, D)) < density))
        X_nd = X_nd.astype(np.float32)
        sparse_X = sparse_encoder.SparseInputs.of(X_nd)
        batches = [X_nd[i * batch_size:(i + 1) * batch_size] for i in range(8)]
        ids = [sparse_X.rows(np.arange(i * batch_size, (i + 1) * batch_size)) for i in range(8)]
        times = {"blas": [], "sparse": []}
        with _blas_threads(1 if lanes > 1 else lanes):
            for r in range(repeats + 1):
                for name, call in (("blas", lambda i: cpu_kernels.encode(W_dh, b_h, batches[i % 8], lanes)),
                                   ("sparse", lambda i: sparse_encoder.encode_rows(ids[i % 8], W_dh, b_h, lanes))):
                    start = time.perf_counter()
                    for i in range(steps):
                        call(i)
                    if r:
                        times[name].append((time.perf_counter() - start) / steps)
        rows.append({"density": round(sparse_X.density, 4), "blas_ms": 1e3 * statistics.median(times["blas"]),
                     "sparse_ms": 1e3 * statistics.median(times["sparse"]),
                     "sparse_over_blas": statistics.median(a / b for a, b in zip(times["sparse"], times["blas"]))})
    wins = [row["density"] for row in rows if row["sparse_over_blas"] < 1]
    result = {"threads": lanes, "rows": rows, "sparse_wins_up_to_density": max(wins) if wins else None,
              "max_density_now": sparse_encoder.MAX_DENSITY}
    log(f"X W from non-zeros / BLAS's, {lanes} lane(s), random inputs: "
        + ", ".join(f"density {row['density']:.2f}: {row['sparse_over_blas']:.2f}" for row in rows))
    return result


# ---- The step part by part, beside its floors ----

@_kernel(fastmath={"contract"})
def _stream_floor(W_hd, V_hd, momentum, row_start, row_stop):
    """One pass reading and writing every row of W and V: what the momentum update cannot go below."""
    for h in prange(row_start, row_stop):
        w = W_hd[h]
        v = V_hd[h]
        for d in range(w.shape[0]):
            step = v[d] * momentum
            v[d] = step
            w[d] += step


@_kernel(fastmath={"reassoc", "contract"})
def _arithmetic_floor(rows_rd, out_d, count, start, stop):
    """``stop - start`` row multiply-adds ``out += a row`` over 32 cache-resident rows: the sparse parts'
    4 N k D multiply-adds at the rate of contiguous, cached rows (no gathers from W)."""
    R = rows_rd.shape[0]
    for p in range(start, stop):
        row = rows_rd[p % R]
        a = row[0]
        for d in range(out_d.shape[0]):
            out_d[d] += a * row[d]


def _in_lanes(kernel, lanes: int, size: int, *args):
    """``kernel(*args, start, stop)`` over ``range(size)``: one call on one lane, else shared by the lanes."""
    if lanes == 1:
        kernel(*args, 0, size)
        return
    from ksae_cupy.cpu.lanes import lanes as lanes_of, share
    lanes_of(lanes).run(lambda lane: kernel(*args, *share(lane, lanes, size)))


def step_parts(D: int, H: int, k: int, batch_size: int, topk_method: str, threads: int, steps: int = 300,
               log=print, inputs=None, start=None) -> dict:
    """The sparse CPU step as the trainer runs it (``threads`` lanes, BLAS on one thread beside them),
    timed part by part over ``steps`` steps (medians, ms), beside the floors it is measured against:
    ``X W`` alone (BLAS on ``threads`` threads), one streaming pass over ``W`` and ``V``, and the
    sparse parts' ``4 N k D`` multiply-adds on contiguous cached rows.

    ``start`` (:class:`ksae_cupy.bench.trained.TrainedStart`): the step from that trained model's parameters
    and velocities, the update at its rate and momentum (dead units skipped as the trainer skips them); None: a
    fresh model at the paper's rate.

    ``inputs`` (:func:`mnist_inputs`): batches of its training rows, ``X W`` from their non-zero inputs where
    the trainer would take that encoder (``KSAE_ENCODER``, the density); else random batches with MNIST's
    19% of non-zeros and BLAS's ``X W``."""
    from ksae_cupy.cpu.lanes import share

    if not cpu_kernels.enabled():
        return {}
    lanes = max(1, threads or 1)
    rng = np.random.default_rng(0)
    if start is None:
        params = model.init_params(D, H, paper.SIGMA, rng, np.float32)
        velocities = {name: np.zeros_like(value) for name, value in params.items()}
        lr, momentum = paper.LR, paper.MOMENTUM
    else:
        params, velocities = start.host_state()
        config = start.config(k, 1)
        lr, momentum = float(config.lr), float(config.momentum)
    params["W_dh"], velocities["W_dh"] = sparse_layout(params["W_dh"]), sparse_layout(velocities["W_dh"])
    still_h = np.zeros(H, dtype=np.bool_)  # the update's skip of dead units, as the trainer's optimizer keeps it
    batches = [(rng.random((batch_size, D), dtype=np.float32) * (rng.random((batch_size, D)) < 0.19))
               .astype(np.float32) for _ in range(8)]
    rows = [None] * 8
    if inputs is not None:
        X_train = inputs[0]
        sparse_X = sparse_encoder.SparseInputs.of(X_train)
        row_ids = [rng.choice(X_train.shape[0], batch_size, replace=False) for _ in range(8)]
        batches = [np.ascontiguousarray(X_train[r]) for r in row_ids]
        if sparse_encoder.takes_sparse_encoder(sparse_X.density, sparse_encoder.chosen_encoder()):
            rows = [sparse_X.rows(r) for r in row_ids]
    W_dh, W_hd, V_hd = params["W_dh"], params["W_dh"].T, velocities["W_dh"].T
    descending = topk_method == "sort"
    parts = {"encode_XW_plus_b": [], "select_decode_dZ": [], "update_W": [], "update_biases": []}
    clock = time.perf_counter
    with _blas_threads(1 if lanes > 1 else lanes):
        for i in range(steps + 20):  # the first 20 compile and warm caches: not counted
            X_nd, X_rows = batches[i % 8], rows[i % 8]
            t0 = clock()
            Z_nh = (cpu_kernels.encode(W_dh, params["b_h"], X_nd, lanes) if X_rows is None else
                    sparse_encoder.encode_rows(X_rows, W_dh, params["b_h"], lanes))
            t1 = clock()
            _, idx_nk, val_nk, R_nd, dZ_nk = cpu_kernels.select_decode_and_backprop(
                Z_nh, k, descending, W_hd, params["c_d"], X_nd, False, lanes)
            t2 = clock()
            cpu_kernels.momentum_update_rows(W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk, momentum, lr, lanes,
                                             still_h)
            t3 = clock()
            db_h = np.bincount(idx_nk.ravel(), weights=dZ_nk.ravel(), minlength=H).astype(np.float32)
            cpu_kernels.momentum_update(params["b_h"], velocities["b_h"], db_h, momentum, lr)
            cpu_kernels.momentum_update(params["c_d"], velocities["c_d"], R_nd.sum(axis=0), momentum, lr)
            np.bincount(idx_nk.ravel(), minlength=H)  # the trainer's kept count
            t4 = clock()
            if i >= 20:
                for name, (a, b) in zip(parts, ((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
                    parts[name].append(b - a)
        stream = _compiled(_stream_floor, serial=True)
        floor_stream = _median_seconds(lambda i: _in_lanes(stream, lanes, H, W_hd, V_hd, np.float32(0.9)),
                                       _NoSync, 7, 50)
        rows_rd, out_d = rng.random((32, D), dtype=np.float32), np.zeros(D, np.float32)
        arithmetic = _compiled(_arithmetic_floor, serial=True)
        outs = [np.zeros(D, np.float32) for _ in range(lanes)]

        def arithmetic_in_lanes(i):
            count = 4 * batch_size * k
            if lanes == 1:
                arithmetic(rows_rd, out_d, count, 0, count)
                return
            from ksae_cupy.cpu.lanes import lanes as lanes_of
            lanes_of(lanes).run(lambda lane: arithmetic(rows_rd, outs[lane], count, *share(lane, lanes, count)))

        floor_arithmetic = _median_seconds(arithmetic_in_lanes, _NoSync, 7, 50)
    with _blas_threads(lanes):
        floor_xw = _median_seconds(lambda i: batches[i % 8] @ W_dh, _NoSync, 7, 50)
    # Input sparsity (MNIST: ~81% zero pixels): X W from the non-zero pixels only, SciPy's CSR product
    # (one thread), building the CSR included, with W in the row order that product wants (a copy,
    # made once here: its best case). Adopted only where it beats BLAS; it has not here (docs/results/benchmarks.md).
    import scipy.sparse
    W_rows = np.ascontiguousarray(W_dh)
    input_sparse = _median_seconds(lambda i: scipy.sparse.csr_matrix(batches[i % 8]) @ W_rows, _NoSync, 7, 50)
    ms = {name: 1e3 * statistics.median(values) for name, values in parts.items()}
    step_ms = sum(ms.values())
    floors = {"XW_alone_blas": 1e3 * floor_xw, "stream_W_and_V": 1e3 * floor_stream,
              "sparse_arithmetic_4NkD": 1e3 * floor_arithmetic}
    floor_ms = floors["XW_alone_blas"] + floors["stream_W_and_V"] + floors["sparse_arithmetic_4NkD"]
    result = {"threads": lanes, "inputs": "random, 19% non-zero" if inputs is None else inputs[2],
              "model": "fresh" if start is None else start.made, "lr": lr,
              "units_skipped_by_the_update_at_the_end": int(still_h.sum()),
              "encoder": "blas" if rows[0] is None else "sparse",
              "parts_ms": ms, "step_ms": step_ms, "floors_ms": floors, "floor_sum_ms": floor_ms,
              "XW_from_nonzero_pixels_csr_ms": 1e3 * input_sparse,
              "step_over_XW": step_ms / floors["XW_alone_blas"], "step_over_floor_sum": step_ms / floor_ms}
    log(f"parts at {lanes} thread(s), k={k}, {result['model']} model, {result['encoder']} encoder: " + ", ".join(f"{name} {value:.3f}" for name, value in ms.items())
        + f" = {step_ms:.3f} ms | floors: " + ", ".join(f"{name} {value:.3f}" for name, value in floors.items())
        + f" | step / X W {result['step_over_XW']:.2f}, step / floors {result['step_over_floor_sum']:.2f}"
        + f" | X W from non-zero pixels (SciPy CSR) {result['XW_from_nonzero_pixels_csr_ms']:.3f}")
    return result


class _NoSync:
    @staticmethod
    def synchronize():
        pass


ENCODER_CHOICES = ("both", *sparse_encoder.ENCODERS)


def bench_train_step(backend, D=784, H=paper.HIDDEN, k=paper.K, batch_size=paper.BATCH_SIZE, topk_method="sort", repeats=7, steps=50,
                     threads: int | None = 1, k_sweep=(), with_torch: bool = True, epoch_ks=(), log=print,
                     encoder: str = "both", epoch_repeats: int = 3, trained_epochs: int = 10,
                     from_run=None) -> dict:
    """Dense step, sparse step, PyTorch and ``X W`` alone at ``k`` (and each k of ``k_sweep``); on the CPU
    kernels, the sparse step with each encoder side by side (:func:`compare_encoders`; ``encoder`` ``both``:
    BLAS's and the sparse one); then, for each k of ``epoch_ks``, a whole MNIST epoch and its parts
    (:func:`time_epoch`), with each encoder, interleaved ``epoch_repeats`` times.

    On the CPU kernels the epochs and the step's parts are timed twice, side by side: on a fresh model and on a
    trained one (:mod:`ksae_cupy.bench.trained`): ``from_run`` (a ``TrainedStart``, a run folder's checkpoint),
    else a model trained here for ``trained_epochs`` epochs (0: the fresh model only)."""
    if encoder not in ENCODER_CHOICES:
        raise KsaeError(f"--encoder {encoder!r} is not allowed; use one of {', '.join(ENCODER_CHOICES)}")
    # The sparse encoder first: the epoch reported at the top of the result (epoch_s, parts_s) is then the one
    # ksae-train runs on MNIST (KSAE_ENCODER auto takes it at MNIST's density); each is under by_encoder.
    encoders = ("sparse", "dense") if encoder == "both" else (encoder,)
    limit, limited = _thread_limit(threads)
    comparison = {}
    with backend.use(), limit:
        log(f"threads: {threads if limited else 'not limited (threadpoolctl missing)'} for every contender")
        main = _time_at_k(backend, D, H, k, batch_size, topk_method, repeats, steps, threads, with_torch, log)
        sweep = [_time_at_k(backend, D, H, kk, batch_size, topk_method, repeats, steps, threads, with_torch, log)
                 for kk in k_sweep]
        kernels = not backend.is_gpu and cpu_kernels.enabled()
        inputs = mnist_inputs(D) if kernels else None
        if kernels:
            comparison = compare_encoders(D, H, k, batch_size, topk_method, threads if limited else 1, encoders,
                                          repeats, steps, inputs, log)
            if encoder != "dense":
                comparison["density_sweep"] = encoder_density_sweep(D, H, batch_size, threads if limited else 1,
                                                                    repeats, steps, log=log)
        start = _trained_start(backend, inputs, H, k, batch_size, topk_method, trained_epochs, from_run, log) \
            if kernels else None
        epochs = [time_epoch(backend, D, H, kk, batch_size, topk_method, log=log, inputs=inputs,
                             encoders=encoders if kernels else (None,), repeats=epoch_repeats)
                  for kk in epoch_ks]
        trained_steps = _time_at_k(backend, D, H, k, batch_size, topk_method, repeats, steps, threads, with_torch, log,
                                   start, inputs) if start is not None else None
        trained_epochs_timed = [time_epoch(backend, D, H, kk, batch_size, topk_method, log=log, inputs=inputs,
                                           encoders=encoders, repeats=epoch_repeats, trained=start)
                                for kk in epoch_ks] if start is not None else []
    parts = ({} if backend.is_gpu else
             step_parts(D, H, k, batch_size, topk_method, threads if limited else 1, log=log, inputs=inputs))
    trained_parts = step_parts(D, H, k, batch_size, topk_method, threads if limited else 1, log=log, inputs=inputs,
                               start=start) if start is not None else {}
    for fresh, trained in zip(epochs, trained_epochs_timed):
        log(f"epoch at k={fresh['k']}, fresh against trained ({start.made}): {fresh['epoch_s']:.2f} s against "
            f"{trained['epoch_s']:.2f} s (steps and updates {fresh['steps_s']:.2f} against {trained['steps_s']:.2f})")
    if trained_parts:
        log(f"step + update / X W, fresh against trained: {parts['step_over_XW']:.2f} against "
            f"{trained_parts['step_over_XW']:.2f}")
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
        "paper_schedule_estimate_h": _schedule_estimate_h(epochs, k),
        "step_parts": parts,
        "trained_model": None if start is None else {"made": start.made, "epoch": start.epoch},
        "trained_steps": trained_steps,
        "trained_epochs": trained_epochs_timed,
        "trained_step_parts": trained_parts,
        "encoder": encoder,
        "encoder_comparison": comparison,
        "repeats": repeats, "steps_per_repeat": steps,
        "meta": run_metadata(backend),
    }
    log(f"MNIST epoch (50,000 images): dense {result['epoch_s_mnist']['dense']:.2f} s, "
        f"sparse {result['epoch_s_mnist']['sparse']:.2f} s; load average {result['load_average']}")
    if result["paper_schedule_estimate_h"] is not None:
        log(f"the paper's 5000-epoch schedule (k 100 -> {k}): about {result['paper_schedule_estimate_h']:.2f} h here")
    return result


def _trained_start(backend, inputs, H: int, k: int, batch_size: int, topk_method: str, trained_epochs: int, from_run,
                   log):
    """The trained model the bench times beside the fresh one (:mod:`ksae_cupy.bench.trained`), or None."""
    from ksae_cupy.bench import trained

    if from_run is not None:
        return from_run
    if trained_epochs <= 0:
        return None
    X_train, X_valid, what = inputs
    lr = paper.LR if what.startswith("MNIST") else 1e-3  # as time_epoch's fresh model
    return trained.trained_here(backend, X_train, X_valid, H, k, batch_size, topk_method, trained_epochs, lr, log)


def _schedule_estimate_h(epochs: list, k: int, k_start: int = paper.K_START, total: int = paper.EPOCHS) -> float | None:
    """Hours for the paper's schedule (k from ``k_start`` down to ``k`` over the first half, then ``k``)
    from epochs timed at both ends (``--epoch-k 100,25``), a checkpoint every 10 epochs included.
    Approximation: an epoch's cost taken as linear in k over the first half."""
    at = {e["k"]: e["epoch_with_checkpoint_every_10_s"] for e in epochs}
    if k_start not in at or k not in at:
        return None
    return (total / 2 * (at[k_start] + at[k]) / 2 + total / 2 * at[k]) / 3600
