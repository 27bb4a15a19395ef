"""Seconds per epoch of R runs packed in one launch against one run alone (issue 52's goal on a GPU:
16 runs at most 3x the time of one): ``ksae-bench packed`` and ``bin/gpu-campaign``'s ``packed`` stage
(``python -m ksae_cupy.bench.packed``).

For each R, R trainers of the paper's model (seeds 0 .. R-1, one k, no schedule) train as one
:class:`~ksae_cupy.training.packed.Pack` (on a GPU one stacked model; on the CPU one run after another,
so there about R times one run); ``alone`` is one run as ksae-train trains it (on a GPU its captured
step). Each timing is the median epoch of ``epochs`` after a first, untimed epoch (kernels compile,
memory pools fill). Validated before a time counts: the packed run of seed 0 must give the loss of the run
alone on that first epoch (within float32 rounding), and every run's loss must stay finite and no higher
than its first epoch's (a diverged run's epochs time nothing worth reporting); else nothing is reported.
The training passes only: no validation set.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

import numpy as np

from ksae_cupy import paper
from ksae_cupy.bench.metadata import run_metadata, write_results
from ksae_cupy.errors import KsaeError

AGREE_RTOL = 1e-4  # seed 0 packed against seed 0 alone on the first epoch (float32 rounding)
CAMPAIGN_RUNS, TINY_RUNS = (1, 16), (1, 4)  # the campaign's packs: 16 runs, the goal's size; --tiny's
TINY_ROWS, TINY_HIDDEN, TINY_K = 512, 32, 4  # --tiny: a few batches (the stand-in emulates every kernel)


def bench_packed(X_nd, backend, runs=(1, 4, 16), k: int = paper.K, hidden: int = paper.HIDDEN,
                 batch_size: int = paper.BATCH_SIZE, epochs: int = 3, lr: float = paper.LR, out_dir=None,
                 log=print) -> dict:
    """Time ``epochs`` epochs of each pack size in ``runs`` on the rows ``X_nd`` (host, float32) on
    ``backend``; the results (seconds per epoch, and each pack's time over one run alone) as a dict, also
    written as JSON under ``out_dir`` (default results/benchmarks) with the run's metadata (``meta``).
    A run that fails the checks of the module docstring raises :class:`KsaeError` and nothing is written."""
    from ksae_cupy.training.packed import Pack
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    if epochs < 1 or not runs or min(runs) < 1:
        raise KsaeError(f"epochs {epochs} and runs {runs} are not allowed; use epochs >= 1 and pack sizes >= 1")
    D = X_nd.shape[1]
    X_dev = backend.asarray(np.asarray(X_nd, dtype=np.float32))

    def config(seed):
        return TrainConfig(hidden=hidden, k=k, k_start=None, epochs=1 + epochs, batch_size=batch_size, lr=lr,
                           seed=seed)

    def timed(fit, trainers):
        """The first epoch untimed, then the median seconds of the next ``epochs``; and each trainer's
        losses, epoch by epoch. ``fit(on_epoch)`` trains until every trainer has its epochs."""
        seconds, losses = [], [[] for _ in trainers]

        def on_epoch(*args):  # (report) from a trainer, (member, report) from a pack
            member, report = (0, args[0]) if len(args) == 1 else args
            losses[member].append(report.train_loss)

        with backend.use():
            for epoch in range(1 + epochs):
                for trainer in trainers:
                    trainer.config.epochs = epoch + 1
                backend.synchronize()
                started = time.perf_counter()
                fit(on_epoch)
                backend.synchronize()
                if epoch:
                    seconds.append(time.perf_counter() - started)
        return float(np.median(seconds)), losses

    def check_trained(what, losses):
        """Refuse a time to runs whose loss went non-finite or rose above its first epoch's."""
        for seed, run in enumerate(losses):
            if not all(math.isfinite(loss) for loss in run) or max(run) > run[0]:
                raise KsaeError(f"{what}: the run of seed {seed} lost {run} epoch by epoch (not finite, or above "
                                f"its first epoch's): it diverged; nothing is reported")

    alone = Trainer(config(0), backend, D=D)
    alone_s, (alone_losses,) = timed(lambda on_epoch: alone.fit(X_dev, None, on_epoch), [alone])
    check_trained("one run alone", [alone_losses])
    log(f"one run alone: {alone_s:.4f} s an epoch")
    rows = []
    for R in runs:
        trainers = [Trainer(config(seed), backend, D=D) for seed in range(R)]
        pack = Pack(trainers)
        pack_s, losses = timed(lambda on_epoch: pack.fit(X_dev, None, on_epoch), trainers)
        if not np.isclose(losses[0][0], alone_losses[0], rtol=AGREE_RTOL):  # the untimed epoch: before times count
            raise KsaeError(f"pack of {R}: the run of seed 0 lost {losses[0][0]} on its first epoch, alone "
                            f"{alone_losses[0]}; the packed step is wrong here, nothing is reported")
        check_trained(f"pack of {R}", losses)
        rows.append({"runs": R, "stacked": pack.stacked, "epoch_s": pack_s, "over_one_run": pack_s / alone_s,
                     "per_run_s": pack_s / R})
        log(f"pack of {R} ({'stacked' if pack.stacked else 'one after another'}): {pack_s:.4f} s an epoch, "
            f"{pack_s / alone_s:.2f}x one run")
    result = {"benchmark": "packed", "status": "done", "reason": "", "rows_per_epoch": int(X_nd.shape[0]), "D": D,
              "hidden": hidden, "k": k, "batch_size": batch_size, "lr": lr, "timed_epochs": epochs,
              "alone_epoch_s": alone_s, "packs": rows, "meta": run_metadata(backend)}
    result["path"] = str(write_results("packed", result, out_dir))
    return result


def campaign_packed(device: str = "gpu", *, tiny: bool = False, data_dir: Path | None = None,
                    out_dir: Path) -> dict:
    """The campaign's measure: 1 run against 16 on MNIST at the paper's settings (``tiny``: 1 against 4 on
    512 synthetic rows, 32 units). A run refused, or no MNIST, is a result too: ``status`` ``failed`` and
    its ``reason``, written as JSON like a measure."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.datasets import data_root, load_dataset

    backend = resolve_device(device)
    try:
        data = load_dataset("synthetic" if tiny else "mnist", data_dir or data_root(), log=lambda *_: None)
        if tiny:
            data = dataclasses.replace(data, X_train=data.X_train[:TINY_ROWS])
        return bench_packed(data.X_train, backend, runs=TINY_RUNS if tiny else CAMPAIGN_RUNS,
                            k=TINY_K if tiny else paper.K, hidden=TINY_HIDDEN if tiny else paper.HIDDEN,
                            epochs=1 if tiny else 3, out_dir=out_dir, log=lambda line: print(line, flush=True))
    except KsaeError as exc:
        failed = {"benchmark": "packed", "status": "failed", "reason": str(exc), "meta": run_metadata(backend)}
        failed["path"] = str(write_results("packed", failed, out_dir))
        return failed


def main(argv=None) -> int:
    """``python -m ksae_cupy.bench.packed --out DIR [--device gpu] [--tiny] [--data-dir D]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder of the JSON")
    ap.add_argument("--device", default="gpu", help="gpu, gpu:N or cpu")
    ap.add_argument("--tiny", action="store_true", help="the synthetic dataset, 32 units, 1 and 4 runs")
    ap.add_argument("--data-dir", type=Path, default=None, help="data root holding mnist/ (default $KSAE_DATA_DIR)")
    args = ap.parse_args(argv)
    result = campaign_packed(args.device, tiny=args.tiny, data_dir=args.data_dir, out_dir=args.out)
    print(f"packed runs: {result['status']}{': ' + result['reason'] if result['reason'] else ''}", flush=True)
    print(f"packed JSON: {result['path']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
