"""Many runs in one launch against one run alone (``bin/gpu-campaign``'s ``packed`` stage; issue 52 item 2).

Times the packed-training API, ``train_packed(configs, data, backend, folders)`` (R training configs, the
:class:`~ksae_cupy.datasets.dataset.Dataset`, the backend, one run folder per config), with 1 run and with
16 (tiny: 4), each run at the paper's settings but for its seed, for a few epochs. The API is found by a
feature check (:func:`find_train_packed`): where no module of :data:`PACKED_MODULES` has it yet, the stage
is skipped and says so. Before a time is reported each run's ``metrics.jsonl`` must hold every epoch with
a finite loss no higher than its first epoch's, else that launch's time is refused with the reason; and
the packed launch's first run (seed 0) is compared, epoch by epoch, with the same run alone.
Seconds per epoch: the median of each launch's epochs after the first (which compiles and captures),
from run 0's ``metrics.jsonl``, else the launch's wall time over its epochs.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import inspect
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ksae_cupy import paper
from ksae_cupy.bench.metadata import run_metadata, write_results

PACKED_MODULES = ("ksae_cupy.training.packed_runs", "ksae_cupy.training.packed", "ksae_cupy.parallel.packed",
                  "ksae_cupy.session.packed")
RUN_COUNTS, TINY_RUN_COUNTS = (1, 16), (1, 4)
EPOCHS, TINY_EPOCHS = 4, 2
AGREE_RTOL = 1e-3  # a run packed with others against the same run alone (float32 rounding on a GPU)


def find_train_packed():
    """``(train_packed, "module")``, or ``(None, why not)`` where no module of :data:`PACKED_MODULES` has it."""
    for name in PACKED_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its package is not there either
            found = False
        if found:
            train_packed = getattr(importlib.import_module(name), "train_packed", None)
            if callable(train_packed):
                return train_packed, name
    return None, f"no train_packed in {', '.join(PACKED_MODULES)}: the packed-runs API is not there yet"


def _epoch_records(folder: Path) -> list[dict]:
    from ksae_cupy.training.runs import metrics_file, parse_metrics

    path = metrics_file(folder)
    return parse_metrics(path)[0] if path.is_file() else []


def _launch(train_packed, configs, data, backend, folders: list[Path]) -> dict:
    """One call of ``train_packed``; its checks, then its time (or why none is reported)."""
    t0 = time.perf_counter()
    train_packed(configs, data, backend, folders)
    backend.synchronize()
    wall = time.perf_counter() - t0
    epochs = configs[0].epochs
    runs = [[r.get("train_loss", math.nan) for r in _epoch_records(folder)] for folder in folders]
    record = {"runs": len(configs), "wall_seconds": wall, "train_losses": runs}
    for i, losses in enumerate(runs):
        if len(losses) != epochs:
            record["refused"] = f"run {i} logged {len(losses)} epochs, not {epochs}"
        elif not all(math.isfinite(x) for x in losses):
            record["refused"] = f"run {i}'s loss is not finite: {losses}"
        elif max(losses) > losses[0]:
            record["refused"] = f"run {i} diverged: its loss rose above its first epoch's ({losses})"
        if "refused" in record:
            record["refused"] += "; no time reported"
            return record
    seconds = [r.get("seconds") for r in _epoch_records(folders[0])][1:]
    if seconds and all(isinstance(s, (int, float)) for s in seconds):
        record.update(seconds_per_epoch=float(np.median(seconds)), seconds_from="metrics.jsonl, epochs after the first")
    else:
        record.update(seconds_per_epoch=wall / epochs, seconds_from="wall time over the epochs")
    return record


def bench_packed(device: str = "gpu", *, tiny: bool = False, data_dir: Path | None = None, out_dir: Path,
                 write: bool = True) -> dict:
    """1 run against R runs in one launch; returns the result (``"status"``: done, skipped or failed)."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.datasets import data_root, load_dataset
    from ksae_cupy.training.config import TrainConfig

    backend = resolve_device(device)
    out_dir = Path(out_dir)
    payload = {"benchmark": "packed-runs", "meta": run_metadata(backend), "status": "done", "reason": ""}
    train_packed, where = find_train_packed()
    if train_packed is None:
        payload.update(status="skipped", reason=where)
    else:
        payload["api"] = f"{where}.train_packed{inspect.signature(train_packed)}"
        hidden, k = (32, 4) if tiny else (paper.HIDDEN, paper.K)
        epochs = TINY_EPOCHS if tiny else EPOCHS
        launches = {}
        shutil.rmtree(out_dir / "runs", ignore_errors=True)  # a benchmark's runs, not kept: every call starts afresh
        try:
            data = load_dataset("synthetic" if tiny else "mnist", data_dir or data_root(), log=lambda *_: None)
            if tiny:  # a few batches: the stand-in emulates every kernel on the host
                data = dataclasses.replace(data, X_train=data.X_train[:512], X_valid=data.X_valid[:128])
            payload["setup"] = {"dataset": data.name, "rows": len(data.X_train), "hidden": hidden, "k": k,
                                "epochs": epochs, "lr": paper.LR, "momentum": paper.MOMENTUM,
                                "batch": paper.BATCH_SIZE}
            for R in TINY_RUN_COUNTS if tiny else RUN_COUNTS:
                configs = [TrainConfig(hidden=hidden, k=k, k_start=None, epochs=epochs, seed=seed)
                           for seed in range(R)]
                folders = [out_dir / "runs" / f"packed{R}" / f"seed{seed}" for seed in range(R)]
                launches[R] = _launch(train_packed, configs, data, backend, folders)
        except Exception as exc:  # noqa: BLE001 -- no MNIST, or an API that does not take this call: recorded
            payload.update(status="failed", reason=f"stopped: {type(exc).__name__}: {exc}".splitlines()[0])
        payload["launches"] = {str(R): record for R, record in launches.items()}
        refused = [f"{R} run(s): {r['refused']}" for R, r in launches.items() if "refused" in r]
        alone, packed = (launches.get(R) for R in (TINY_RUN_COUNTS if tiny else RUN_COUNTS))
        if payload["status"] == "done" and refused:
            payload.update(status="failed", reason="; ".join(refused))
        elif payload["status"] == "done" and alone and packed:
            a, p = np.asarray(alone["train_losses"][0]), np.asarray(packed["train_losses"][0])
            diff = float(np.max(np.abs(a - p) / np.abs(a))) if a.shape == p.shape and a.size else math.inf
            payload["seed0_alone_vs_packed_max_rel_diff"] = diff
            if not diff <= AGREE_RTOL:
                payload.update(status="failed", reason=f"seed 0 packed differs from seed 0 alone by {diff:.3g}")
            else:
                payload["packed_over_alone"] = packed["seconds_per_epoch"] / alone["seconds_per_epoch"]
    if write:
        payload["path"] = str(write_results("packed-runs", payload, out_dir))
    return payload


def main(argv=None) -> int:
    """``python -m ksae_cupy.bench.packed_runs --out DIR [--device gpu] [--tiny] [--data-dir D]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder of the JSON and the runs")
    ap.add_argument("--device", default="gpu", help="gpu, gpu:N or cpu")
    ap.add_argument("--tiny", action="store_true", help="the synthetic dataset, 32 units, 1 and 4 runs")
    ap.add_argument("--data-dir", type=Path, default=None, help="data root holding mnist/ (default $KSAE_DATA_DIR)")
    args = ap.parse_args(argv)
    result = bench_packed(args.device, tiny=args.tiny, data_dir=args.data_dir, out_dir=args.out)
    print(f"packed runs: {result['status']}{': ' + result['reason'] if result['reason'] else ''}", flush=True)
    print(f"packed-runs JSON: {result['path']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
