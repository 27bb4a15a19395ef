"""What every benchmark figure is recorded with: device, versions, commit, date; and where.

Results are JSON files under ``results/benchmarks/`` (or ``--out``), written atomically: the
repository keeps every measurement (run folders, figures, benchmark JSON) in one ``results/`` folder.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from pathlib import Path

import numpy as np

RESULTS_DIR = Path("results") / "benchmarks"


def git_commit() -> str:
    """The current commit (with ``-dirty`` when the tree has changes), or ``unknown``."""
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_metadata(backend=None) -> dict:
    """Device, driver, library versions, commit and date, for one benchmark run."""
    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
        **cpu_model_and_simd(),
        "cpu_count": os.cpu_count(),
        "blas": _blas_name(),
    }
    if backend is not None and backend.is_gpu:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(backend.gpu_index)
        name = props["name"]
        meta.update({
            "device": name.decode() if isinstance(name, bytes) else name,
            "cupy": cupy.__version__,
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "cuda_driver": cupy.cuda.runtime.driverGetVersion(),
        })
    else:
        meta["device"] = "cpu"
    return meta


def import_torch(cuda: bool = False):
    """``(torch, None)``, or ``(None, why)`` where torch does not import (absent or broken) or, with ``cuda``,
    sees no CUDA device: every benchmark that times PyTorch asks here."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 -- absent or broken: said, not raised
        return None, f"torch does not import ({type(exc).__name__})"
    if cuda and not torch.cuda.is_available():
        return None, f"torch {torch.__version__} sees no CUDA device"
    return torch, None


def torch_meta() -> dict:
    """PyTorch's version, its CUDA and whether it sees a device (None where torch does not import):
    recorded with every figure that times PyTorch."""
    try:
        import torch
    except Exception:  # noqa: BLE001 -- absent or broken: recorded as None
        return {"torch": None}
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "torch_cuda_available": torch.cuda.is_available()}


SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile", "neon", "asimd",
              "sve")


def cpu_model_and_simd() -> dict:
    """``{"cpu_model": ..., "simd": [...]}`` from /proc/cpuinfo (Linux); empty where it cannot be read.
    The SIMD flags decide what the compiled kernels and BLAS can use, so they go with every figure."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's lines
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {"cpu_model": fields.get("model name") or fields.get("CPU part") or "unknown",
            "simd": [flag for flag in SIMD_FLAGS if flag in flags]}


def _blas_name() -> str:
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version', '')}".strip()
    except Exception:  # older NumPy has no mode="dicts"
        return "unknown"


def write_results(name: str, payload: dict, out_dir: Path | None = None) -> Path:
    """Write ``payload`` as ``<out_dir>/<name>-<date>.json`` atomically; return the path."""
    out_dir = Path(out_dir) if out_dir is not None else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"{name}-{stamp}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    json.loads(tmp.read_text())  # verify before the rename
    os.replace(tmp, path)
    return path
