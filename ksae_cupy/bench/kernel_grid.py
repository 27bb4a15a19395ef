"""The top-k kernel grid in one device call: ``bin/gpu-campaign OUT_DIR --kernel-grid``.

For a GPU session lent for minutes: check first that everything the grid needs is there (CuPy with a
device, NVRTC compiling ``kernels/select_topk.cu``, every kernel of ours giving the reference's sets on a
small batch, torch with CUDA unless ``no_torch``), failing within seconds with one ``error:`` line and
exit status 2 if not; then :func:`ksae_cupy.bench.gpu.bench_topk` on the issue's grid (our block and
radix kernels, torch.topk sorted and unsorted, CuPy, RAFT when importable), stopping new shapes
before the budget ends. The JSON (device, versions, commit, date in ``meta``) is written under
OUT_DIR and its path printed last.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from ksae_cupy.bench.metadata import import_torch
from ksae_cupy.errors import KsaeError

MARGIN_S = 75.0  # kept back from the budget: the last shape started, and writing the JSON


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def preflight(device: str, include_torch: bool) -> dict:
    """What the grid needs, checked in seconds; raises KsaeError naming the first thing missing."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.bench.gpu import OUR_KERNELS
    from ksae_cupy.gpu import cuda_kernels as cuda
    from ksae_cupy.topk import topk_sort

    backend = resolve_device(device)  # a KsaeError when cupy or the device is missing
    if not backend.is_gpu:
        raise KsaeError(f"--device {device}: the kernel grid times CUDA kernels; use --device gpu[:N]")
    cupy = backend.xp
    found = {"device": backend.description, "cupy": cupy.__version__}
    if include_torch:
        torch = import_torch(cuda=True)[0]
        if torch is None:
            raise KsaeError("torch with CUDA does not import here; use a Python that has it (the device image's "
                            "python3), or pass --no-torch to time without it")
        found["torch"] = torch.__version__
    rng = np.random.default_rng(0)
    Z_host = rng.standard_normal((37, 1000)).astype(np.float32)
    Z_host[3, :40] = 0.5  # ties at the k-th value
    with backend.use():
        Z = cupy.asarray(Z_host)
        t0 = time.perf_counter()
        for name, method, variant in OUR_KERNELS:
            idx, _val = cuda.topk_gpu(Z, 25, method, variant=variant)  # the first call compiles every kernel
            ref, _ = topk_sort(Z_host, 25)
            if not np.array_equal(np.sort(idx.get(), axis=1), np.sort(ref, axis=1)):
                raise KsaeError(f"{name} gives a kept set other than the reference's on a 37 x 1000 batch")
        found["compile_and_check_s"] = time.perf_counter() - t0
    return found


def run(out_dir: Path, budget_minutes: float, device: str = "gpu", include_torch: bool = True, **grid) -> int:
    """The checks, then the grid; returns the exit status (0, or 2 with an ``error:`` line)."""
    t0 = time.perf_counter()
    budget_s = 60.0 * float(budget_minutes)
    if budget_s <= MARGIN_S:
        return _fail(f"--budget-minutes {budget_minutes:g} is too short for the kernel grid; use more than "
                     f"{MARGIN_S / 60:.2f}")
    try:
        found = preflight(device, include_torch)
    except KsaeError as exc:
        return _fail(str(exc))
    print(f"kernel grid: {found}", flush=True)
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.bench.gpu import bench_topk

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    left = budget_s - (time.perf_counter() - t0) - MARGIN_S
    result = bench_topk(device=resolve_device(device).gpu_index, include_torch=include_torch, out_dir=out_dir,
                        time_budget_s=left, **grid)
    timed = sum(1 for r in result["results"] if "median_ms" in r)
    print(f"kernel grid: {timed} timings, {len(result['skipped'])} shapes x k skipped, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    print(f"kernel grid JSON: {result['path']}", flush=True)
    return 0
