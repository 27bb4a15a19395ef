"""GPU benchmarks: the top-k kernels against library top-k, and seconds per training epoch.

Both functions return a dict and write it as JSON through :func:`ksae_cupy.bench.metadata.write_results`
(with the run's metadata: device, versions, commit, date). cupy (and torch, when present) are
imported inside the functions, so this module imports anywhere.

Timing method: CUDA events around every call, median over many calls; inputs rotate over enough
buffers that the rotating set is several times the device's L2 cache, so repeated calls do not read
a cached row. Each candidate's kept set is checked against the NumPy reference before it is timed.
Bandwidth is reported against a large device-to-device copy measured in the same run.

Over 400 lines: the top-k and the training benchmarks on a GPU share their timing, their checks against the
NumPy reference and the conditions recorded beside each figure.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from ksae_cupy import paper
from ksae_cupy.bench.metadata import run_metadata, torch_meta, write_results
from ksae_cupy.errors import KsaeError
from ksae_cupy.topk import TOPK_METHODS

TOPK_NS = (128, 4096, 65536)
TOPK_HS = (1000, 4000, 16384, 65536)
TOPK_KS = (25, 150, 1000)
VALIDATE_ROWS = 256  # rows checked against the NumPy reference at each end of the batch
MAX_TIMED_MS = 300.0  # rough cap on the timed calls of one candidate at one size
FULL_SORT_MAX_ELEMENTS = 1 << 28  # CuPy's argpartition sorts whole rows: beyond this it is skipped, not timed
TOPK_TIME_BUDGET_S = 420.0  # bench_topk starts no new shape past this many seconds (a device call is lent for minutes)
# The kernels of ours in the grid: (candidate name, method, variant). "block": the first kernels (one
# block per row); "radix": one warp per row, several rows per block (kernels/select_topk.cu).
OUR_KERNELS = (("ksae_sort", "sort", "block"), ("ksae_threshold", "threshold", "block"),
               ("ksae_radix_sort", "sort", "radix"), ("ksae_radix_threshold", "threshold", "radix"))


def _gpu_backend(device: int):
    from ksae_cupy.backend import resolve_device

    return resolve_device(f"gpu:{int(device)}")


def _median_ms(cupy, fn, inputs, repeats: int, warmup: int) -> dict:
    """Median, 10th and 90th percentile of per-call times (ms), rotating over ``inputs``."""
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    starts = [cupy.cuda.Event() for _ in range(repeats)]
    ends = [cupy.cuda.Event() for _ in range(repeats)]
    for i in range(repeats):
        x = inputs[(i + warmup) % len(inputs)]
        starts[i].record()
        fn(x)
        ends[i].record()
    ends[-1].synchronize()
    times = np.array([cupy.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends)])
    return {"median_ms": float(np.median(times)), "p10_ms": float(np.percentile(times, 10)),
            "p90_ms": float(np.percentile(times, 90)), "repeats": int(repeats)}


def copy_bandwidth(cupy, nbytes: int = 1 << 30, repeats: int = 20) -> dict:
    """Device-to-device copy bandwidth (read + write bytes per second) of an ``nbytes`` buffer, CUDA events."""
    src = cupy.ones(nbytes // 4, dtype=np.float32)
    dst = cupy.empty_like(src)
    stats = _median_ms(cupy, lambda s: dst.data.copy_from_device_async(s.data, s.nbytes), [src], repeats, 3)
    gbps = 2 * src.nbytes / (stats["median_ms"] * 1e-3) / 1e9
    del src, dst
    return {"bytes": int(nbytes), "GBps": gbps, **stats}


class _Candidate:
    """One top-k implementation: ``fn(x)`` on inputs of ``kind`` ("cupy", or "torch": the same buffers
    as torch tensors, converted once before timing), returning ``(idx, val)``."""

    def __init__(self, fn, kind: str = "cupy", index_dtype: str = "int32", skip: str | None = None):
        self.fn, self.kind, self.index_dtype, self.skip = fn, kind, index_dtype, skip


def _raft_select_k():
    """pylibraft's ``select_k``, or the reason it is absent."""
    try:
        from pylibraft.matrix import select_k

        return select_k, None
    except Exception as exc:  # ImportError, or a wheel built for another CUDA
        return None, f"pylibraft does not import ({type(exc).__name__})"


def _topk_candidates(cupy, torch, N: int, H: int, k: int) -> dict:
    """name -> _Candidate for one (N, H, k)."""
    from ksae_cupy.gpu import cuda_kernels as cuda

    cands = {name: _Candidate(lambda Z, m=method, v=variant: cuda.topk_gpu(Z, k, m, variant=v))
             for name, method, variant in OUR_KERNELS}

    def argpartition(Z):
        idx = cupy.argpartition(Z, H - k, axis=1)[:, H - k:]
        return idx, cupy.take_along_axis(Z, idx, axis=1)

    too_big = N * H > FULL_SORT_MAX_ELEMENTS
    cands["cupy_argpartition"] = _Candidate(argpartition, index_dtype="int64",
                                            skip=f"N*H > {FULL_SORT_MAX_ELEMENTS} (CuPy sorts whole rows)" if too_big else None)
    if torch is not None:
        for sorted_ in (True, False):
            def torch_topk(Zt, sorted_=sorted_):
                vals, idx = torch.topk(Zt, k, dim=1, largest=True, sorted=sorted_)
                return idx, vals

            cands[f"torch_topk_{'sorted' if sorted_ else 'unsorted'}"] = _Candidate(torch_topk, "torch", "int64")
    select_k, _why = _raft_select_k()
    if select_k is not None:
        def raft(Z):
            vals, idx = select_k(Z, k=k, select_min=False)
            return cupy.asarray(idx), cupy.asarray(vals)

        cands["raft_select_k"] = _Candidate(raft, index_dtype="int64")
    return cands


def absent_libraries(torch, include_torch: bool) -> dict:
    """Each optional library of the grid that is not timed, with why."""
    absent = {}
    if torch is None:
        absent["torch"] = "left out (--no-torch)" if not include_torch else "torch does not import with CUDA"
    _select_k, why = _raft_select_k()
    if why:
        absent["raft_select_k"] = why
    absent["cuvs_select_k"] = "not wired: cuVS's select_k has no Python binding this benchmark calls"
    return absent


def _import_torch():
    try:
        import torch

        if torch.cuda.is_available():
            return torch
    except Exception:
        pass
    return None


def _to_host(a) -> np.ndarray:
    if hasattr(a, "get"):
        return a.get()
    if hasattr(a, "cpu"):  # torch tensor
        return a.cpu().numpy()
    return np.asarray(a)


def _valid_set(idx, ref_sorted: np.ndarray, rows: np.ndarray) -> bool:
    """The candidate's kept columns on ``rows`` equal the reference's (``ref_sorted``: its columns sorted per row)."""
    got = _to_host(idx)[rows].astype(np.int64)
    return bool(np.array_equal(np.sort(got, axis=1), ref_sorted))


def topk_bytes(N: int, H: int, k: int, itemsize: int = 4) -> int:
    """Bytes a top-k must move at least: the input read once, the k values and int32 indices written."""
    return N * H * itemsize + N * k * (itemsize + 4)


def _time_candidate(cupy, cand: _Candidate, inputs, ref_sorted, rows, repeats: int, warmup: int,
                    moved: int, copy_gbps: float) -> dict:
    """Validate, then time one candidate; a failure is recorded as the record's ``error``."""
    record = {"index_dtype": cand.index_dtype}
    if cand.skip:
        record["skipped"] = cand.skip
        return record
    try:
        idx, _val = cand.fn(inputs[0])  # first call: compiles our kernels
        record["valid"] = _valid_set(idx, ref_sorted, rows)
        del idx, _val
        if record["valid"]:
            first_ms = _median_ms(cupy, cand.fn, inputs, 1, 0)["median_ms"]
            # Slow candidates get fewer repeats: about MAX_TIMED_MS of timed calls, never fewer than 5.
            reps = max(5, min(repeats, int(MAX_TIMED_MS / max(first_ms, 1e-3))))
            stats = _median_ms(cupy, cand.fn, inputs, reps, warmup)
            gbps = moved / (stats["median_ms"] * 1e-3) / 1e9
            record.update(stats, GBps=gbps, bytes_per_s=gbps * 1e9, fraction_of_copy=gbps / copy_gbps)
    except (KsaeError, RuntimeError, MemoryError, ValueError) as exc:  # e.g. out of memory, H too large
        record["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return record


def bench_topk(Ns=TOPK_NS, Hs=TOPK_HS, ks=TOPK_KS, *, repeats: int = 50, warmup: int = 3, device: int = 0,
               include_torch: bool = True, seed: int = 0, out_dir: Path | None = None, write: bool = True,
               time_budget_s: float = TOPK_TIME_BUDGET_S, copy_bytes: int = 1 << 30) -> dict:
    """Time our top-k kernels (block and radix variants) against CuPy, torch.topk and RAFT when importable.

    Like for like: every input is on the device before timing, torch gets the same buffers as
    tensors converted once (``torch.from_dlpack`` outside the timed call), timed ``sorted=True`` and
    ``sorted=False``. For every (N, H, k) with k < H: float32 standard-normal rows, rotated over
    enough buffers to exceed 3x the L2 cache (capped by memory; a shape whose one buffer takes more
    than a third of the free memory is skipped); each candidate's kept set validated on the first
    and last :data:`VALIDATE_ROWS` rows against the NumPy reference before timing; median of
    CUDA-event timings. Reports milliseconds, bytes per second (:func:`topk_bytes` over the median)
    and that rate's fraction of a device-to-device copy timed in the same run. Shapes not started
    within ``time_budget_s`` seconds are recorded as skipped. Returns the result dict (with
    ``"path"`` of the JSON written unless ``write=False``).
    """
    from ksae_cupy.topk import topk_threshold

    backend = _gpu_backend(device)
    cupy = backend.xp
    torch = _import_torch() if include_torch else None
    results, skipped = [], []
    t_start = time.perf_counter()
    with backend.use():
        copy = copy_bandwidth(cupy, nbytes=copy_bytes)
        l2 = int(cupy.cuda.Device().attributes.get("L2CacheSize", 50 << 20))
        rng = cupy.random.default_rng(seed)
        for N in Ns:
            for H in Hs:
                shape_ks = [k for k in ks if k < H]
                if not shape_ks:
                    continue
                buffer_bytes = N * H * 4
                free, _total = cupy.cuda.runtime.memGetInfo()
                why = None
                if time.perf_counter() - t_start > time_budget_s:
                    why = f"time budget of {time_budget_s:.0f} s spent"
                elif 3 * buffer_bytes > free:
                    why = f"one input of {buffer_bytes} bytes needs more than a third of the {free} free"
                if why:
                    skipped += [{"N": N, "H": H, "k": k, "skipped": why} for k in shape_ks]
                    continue
                budget = max(buffer_bytes, free // 4)
                n_buf = int(min(1024, max(2, math.ceil(3 * l2 / buffer_bytes)), max(1, budget // buffer_bytes)))
                Zs = rng.standard_normal((n_buf, N, H), dtype=np.float32)
                inputs = {"cupy": [Zs[i] for i in range(n_buf)]}
                if torch is not None:  # the same memory, converted once, outside every timed call
                    inputs["torch"] = [torch.from_dlpack(z) for z in inputs["cupy"]]
                rows = np.unique(np.concatenate([np.arange(min(N, VALIDATE_ROWS)),
                                                 np.arange(max(0, N - VALIDATE_ROWS), N)]))
                Z_host_rows = np.ascontiguousarray(inputs["cupy"][0][cupy.asarray(rows)].get())
                for k in shape_ks:
                    moved = topk_bytes(N, H, k)
                    ref_sorted = np.sort(topk_threshold(Z_host_rows, k)[0].astype(np.int64), axis=1)
                    for name, cand in _topk_candidates(cupy, torch, N, H, k).items():
                        record = {"N": N, "H": H, "k": k, "candidate": name, "buffers": n_buf, "bytes": moved}
                        record.update(_time_candidate(cupy, cand, inputs[cand.kind], ref_sorted, rows, repeats,
                                                      warmup, moved, copy["GBps"]))
                        results.append(record)
                del Zs, inputs
                cupy.get_default_memory_pool().free_all_blocks()
                if torch is not None:  # torch's cache would otherwise keep what the next shape needs
                    torch.cuda.empty_cache()
    payload = {
        "benchmark": "topk-gpu",
        "meta": {**run_metadata(backend), **torch_meta()},
        "torch": getattr(torch, "__version__", None),
        "absent": absent_libraries(torch, include_torch),
        "copy": copy,
        "config": {"Ns": list(Ns), "Hs": list(Hs), "ks": list(ks), "repeats": repeats, "warmup": warmup,
                   "dtype": "float32", "validate_rows": VALIDATE_ROWS, "bytes": "N*H*4 read + N*k*(4+4) written",
                   "time_budget_s": time_budget_s, "seconds": time.perf_counter() - t_start},
        "results": results,
        "skipped": skipped,
    }
    if write:
        payload["path"] = str(write_results("topk-gpu", payload, out_dir))
    return payload


# ------------------------------------------------------------------------------------------------
# Training epochs.

def _torch_model(torch, W0, X_host):
    """``(device, (W, b, c), velocities, X)`` of the PyTorch variants, on the GPU, float32."""
    dev = torch.device("cuda")
    W = torch.tensor(W0, device=dev, requires_grad=True)
    b = torch.zeros(W0.shape[1], device=dev, requires_grad=True)
    c = torch.zeros(W0.shape[0], device=dev, requires_grad=True)
    return dev, (W, b, c), [torch.zeros_like(p) for p in (W, b, c)], torch.tensor(X_host, device=dev)


def _torch_epoch_fn(torch, W0, X_host, k: int, batch: int, lr: float, momentum: float):
    """The same model in PyTorch (torch.topk + autograd, float32): returns (run_epoch, params)."""
    dev, (W, b, c), vel, X = _torch_model(torch, W0, X_host)
    params = [W, b, c]

    def step(x):
        z = x @ W + b
        vals, idx = torch.topk(z, k, dim=1)
        zs = torch.zeros_like(z).scatter(1, idx, vals)
        xhat = zs @ W.T + c
        loss = 0.5 * ((xhat - x) ** 2).sum() / x.shape[0]
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p, v in zip(params, vel):  # v <- m v - lr g ; p <- p + v (ksae_cupy.momentum_sgd)
                v.mul_(momentum).sub_(lr * p.grad)
                p.add_(v)
        return loss.item()  # one host sync per step, like ksae_cupy.model.reconstruction_loss

    def run_epoch():
        losses = [step(X[i:i + batch]) for i in range(0, X.shape[0] - batch + 1, batch)]
        torch.cuda.synchronize()
        return losses

    return run_epoch


def _torch_graph_epoch_fn(torch, W0, X_host, k: int, batch: int, lr: float, momentum: float):
    """The PyTorch step of :func:`_torch_epoch_fn` captured whole as one CUDA graph (forward, autograd's
    backward and the momentum update; PyTorch captures cuBLAS and keeps the graph's memory in a pool of its
    own), replayed per batch on a static input buffer: what a PyTorch user would write to remove the
    launch overhead. The batch's loss stays on the device until the epoch ends."""
    dev, (W, b, c), vel, X = _torch_model(torch, W0, X_host)
    params = [W, b, c]
    x_static = torch.empty((batch, X.shape[1]), device=dev)

    def step():
        z = x_static @ W + b
        vals, idx = torch.topk(z, k, dim=1)
        zs = torch.zeros_like(z).scatter(1, idx, vals)
        xhat = zs @ W.T + c
        loss = 0.5 * ((xhat - x_static) ** 2).sum() / batch
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, v, g in zip(params, vel, grads):  # v <- m v - lr g ; p <- p + v (ksae_cupy.momentum_sgd)
                v.mul_(momentum).sub_(lr * g)
                p.add_(v)
        return loss.detach()

    side = torch.cuda.Stream()  # warm-up on a side stream before capture, as PyTorch's CUDA-graph recipe says
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            x_static.copy_(X[i * batch:(i + 1) * batch])
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss_static = step()
    starts = range(0, X.shape[0] - batch + 1, batch)
    # The graph reads and writes these tensors' memory by address: they must live as long as it does. Held
    # by nothing else once this function returns, they would go back to PyTorch's allocator and the next
    # tensor allocated there (another variant's weights) would be what the graph trains (NaN on the GPU).
    graph_tensors = (*params, *vel, x_static, loss_static)

    def run_epoch():
        losses = torch.empty(len(starts), device=dev)
        for j, i in enumerate(starts):
            x_static.copy_(X[i:i + batch])
            graph.replay()
            losses[j] = loss_static
        torch.cuda.synchronize()
        return losses.tolist()

    run_epoch.graph_tensors = graph_tensors
    return run_epoch


def _failed_variant(message: str):
    """A variant that could not be set up: its epoch raises, so its row records ``message`` as its error."""
    def run_epoch():
        raise RuntimeError(message)

    return run_epoch


DIVERGED_FACTOR = 2.0  # bench_train_gpu: an epoch's mean loss above twice the first step's is a run that diverged


def bench_train_gpu(n_samples: int = 60000, D: int = 784, H: int = paper.HIDDEN, k: int = paper.K,
                    batch: int = paper.BATCH_SIZE, *, lr: float = paper.LR, momentum: float = paper.MOMENTUM,
                    sigma: float = paper.SIGMA, topk_methods=TOPK_METHODS,
                    epochs: int = 3, project_epochs: int = 5000, device: int = 0, include_torch: bool = True,
                    seed: int = 0, out_dir: Path | None = None, write: bool = True) -> dict:
    """Seconds per MNIST-shaped epoch (60,000 x 784 -> 1000, k=25, batch 128) on the GPU.

    Ours: :func:`ksae_cupy.model.loss_and_grads` + :class:`ksae_cupy.momentum_sgd.MomentumSGD` on cupy
    arrays, for each top-k method; also the fused-kernel step :func:`ksae_cupy.bench.kernel_step.loss_and_grads_fused`.
    Against: the same model in PyTorch (torch.topk + autograd, float32, same batch), when torch
    imports with CUDA, eager and captured whole as one CUDA graph (``torch_cuda_graph``). Ours also as
    the trainer itself: each epoch one CUDA graph (``trainer_epoch_graph_*``, the default,
    :mod:`ksae_cupy.gpu.graph_epoch`; ``trainer_epoch_graph_host_order_*`` with the epoch's order drawn on
    the host instead of in the graph), the parts between cuBLAS products captured per step
    (``trainer_graph_*``, :mod:`ksae_cupy.gpu.graph_step`), or not captured (``trainer_generic_*``).
    Synthetic uniform [0, 1) data of MNIST's shape. Every variant runs one
    warm-up epoch, then ``epochs`` timed epochs; the median epoch time is projected to
    ``project_epochs`` epochs; a variant whose first or last epoch's mean loss is not finite, or above
    twice its first step's, gets ``refused`` (why) and no time: at lr 0.01 these uniform rows diverge, as the
    PyTorch rows of 2026-11-25/26 did. The like-for-like comparison with PyTorch, validated before it is
    timed, is :mod:`ksae_cupy.bench.step_compare`. Returns the result dict (``"path"`` of the JSON unless
    ``write=False``).
    """
    from ksae_cupy.bench.step_compare import refusal
    from ksae_cupy.bench import kernel_step as fused_step
    from ksae_cupy.model import init_params, loss_and_grads
    from ksae_cupy.momentum_sgd import MomentumSGD
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    class _UncapturedTrainer(Trainer):
        captures_gpu_step = False

    class _StepGraphTrainer(Trainer):
        gpu_epoch_graph = False

    class _HostOrderTrainer(Trainer):
        gpu_order_on_device = False

    backend = _gpu_backend(device)
    cupy = backend.xp
    torch = _import_torch() if include_torch else None
    rng = np.random.default_rng(seed)
    X_host = rng.random((n_samples, D), dtype=np.float32)
    W0 = init_params(D, H, sigma, np.random.default_rng(seed + 1))["W_dh"]
    variants = {}
    with backend.use():
        X = cupy.asarray(X_host)

        def ours(step_fn, method):
            params = {name: cupy.asarray(v) for name, v in init_params(D, H, sigma, np.random.default_rng(seed + 1)).items()}
            opt = MomentumSGD(params, momentum, cupy)

            def run_epoch():
                losses = []
                for i in range(0, n_samples - batch + 1, batch):
                    loss, grads, _ = step_fn(params, X[i:i + batch], k, method)
                    opt.step(params, grads, lr)
                    losses.append(loss)
                backend.synchronize()
                return losses

            return run_epoch

        def trainer_epochs(method, cls):
            # The trainer itself (shuffled batches, the last smaller one, dead-unit counts): its epoch as one
            # CUDA graph (Trainer), its step captured between the products (_StepGraphTrainer), or generic.
            # lr / 10: at lr on this uniform data the trainer stops as diverged in its first epoch (the
            # loops above do not check; a step's time does not depend on its rate).
            cfg = TrainConfig(hidden=H, k=k, k_start=None, epochs=10 ** 6, batch_size=batch, lr=lr / 10,
                              momentum=momentum,
                              sigma=sigma, topk=method, seed=seed + 1)
            trainer = cls(cfg, backend, D=D)

            def run_epoch():
                report = trainer.run_epoch(X)
                return [report.train_loss] * -(-n_samples // batch)  # the epoch's mean, once per step

            return run_epoch

        for method in topk_methods:
            variants[f"ksae_{method}"] = ours(loss_and_grads, method)
            variants[f"ksae_fused_{method}"] = ours(fused_step.loss_and_grads_fused, method)
            variants[f"trainer_epoch_graph_{method}"] = trainer_epochs(method, Trainer)
            variants[f"trainer_epoch_graph_host_order_{method}"] = trainer_epochs(method, _HostOrderTrainer)
            variants[f"trainer_graph_{method}"] = trainer_epochs(method, _StepGraphTrainer)
            variants[f"trainer_generic_{method}"] = trainer_epochs(method, _UncapturedTrainer)
        if torch is not None:
            variants["torch"] = _torch_epoch_fn(torch, W0, X_host, k, batch, lr, momentum)
            try:
                variants["torch_cuda_graph"] = _torch_graph_epoch_fn(torch, W0, X_host, k, batch, lr, momentum)
            except RuntimeError as exc:  # capture refused: recorded as the variant's error, the others go on
                variants["torch_cuda_graph"] = _failed_variant(f"{type(exc).__name__}: {exc}".splitlines()[0])

        results = {}
        for name, run_epoch in variants.items():
            record = {}
            try:
                first = run_epoch()  # warm-up: compilation, cuBLAS handles, memory pool
                times = []
                last = first
                for _ in range(epochs):
                    t0 = time.perf_counter()
                    last = run_epoch()
                    times.append(time.perf_counter() - t0)
                record = {"steps_per_epoch": len(last), "first_loss": first[0], "last_loss": last[-1]}
                why = refusal([float(np.mean(first)), float(np.mean(last))], first[0] * DIVERGED_FACTOR)
                if why:  # a run that went to NaN or diverged times other arithmetic: no time reported
                    record["refused"] = why + "; no time reported"
                else:
                    sec = float(np.median(times))
                    record.update(seconds_per_epoch=sec, epoch_times=times, projected_hours=sec * project_epochs / 3600.0)
            except (KsaeError, RuntimeError, MemoryError) as exc:
                record = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
            results[name] = record
    payload = {
        "benchmark": "train-gpu",
        "meta": {**run_metadata(backend), **torch_meta()},
        "torch": getattr(torch, "__version__", None),
        "config": {"n_samples": n_samples, "D": D, "H": H, "k": k, "batch": batch, "lr": lr, "momentum": momentum,
                   "sigma": sigma, "trainer_lr": lr / 10, "epochs_timed": epochs, "project_epochs": project_epochs, "dtype": "float32",
                   "data": "synthetic uniform [0, 1), MNIST shape"},
        "results": results,
    }
    if write:
        payload["path"] = str(write_results("train-gpu", payload, out_dir))
    return payload
