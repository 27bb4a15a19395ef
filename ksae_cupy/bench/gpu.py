"""GPU benchmark of the top-k kernels against library top-k (``ksae-bench topk``); the training epochs on a GPU
are :mod:`ksae_cupy.bench.train_gpu`.

:func:`bench_topk` returns a dict and writes it as JSON through :func:`ksae_cupy.bench.metadata.write_results`
(with the run's metadata: device, versions, commit, date). cupy (and torch, when present) are
imported inside the functions, so this module imports anywhere.

Timing method: CUDA events around every call, median over many calls; inputs rotate over enough
buffers that the rotating set is several times the device's L2 cache, so repeated calls do not read
a cached row. Each candidate's kept set is checked against the NumPy reference before it is timed.
Bandwidth is reported against a large device-to-device copy measured in the same run.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from ksae_cupy.bench.metadata import import_torch, run_metadata, torch_meta, write_results
from ksae_cupy.errors import KsaeError

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
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.topk import topk_threshold

    backend = resolve_device(f"gpu:{int(device)}")
    cupy = backend.xp
    torch = import_torch(cuda=True)[0] if include_torch else None
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
