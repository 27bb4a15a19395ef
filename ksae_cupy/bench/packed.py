"""Seconds per epoch of R runs packed in one launch against one run alone (issue 52's goal on a GPU:
16 runs at most 3x the time of one).

For each R, R trainers of the paper's model (seeds 0 .. R-1, one k, no schedule) train as one
:class:`~ksae_cupy.training.packed.Pack` (on a GPU one stacked model; on the CPU one run after another,
so there about R times one run); ``alone`` is one run as ksae-train trains it (on a GPU its captured
step). Each timing is the median epoch of ``epochs`` after a first, untimed epoch (kernels compile,
memory pools fill). Validated before it is timed: the packed run of seed 0 must give the loss of the run
alone on that first epoch (within float32 rounding). The training passes only: no validation set.
"""
from __future__ import annotations

import time

import numpy as np

from ksae_cupy import paper
from ksae_cupy.bench.metadata import run_metadata, write_results
from ksae_cupy.errors import KsaeError


def bench_packed(X_nd, backend, runs=(1, 4, 16), k: int = 25, hidden: int = paper.HIDDEN,
                 batch_size: int = paper.BATCH_SIZE, epochs: int = 3, lr: float = paper.LR, out_dir=None,
                 log=print) -> dict:
    """Time ``epochs`` epochs of each pack size in ``runs`` on the rows ``X_nd`` (host, float32) on
    ``backend``; the results (seconds per epoch, and each pack's time over one run alone) as a dict, also
    written as JSON under ``out_dir`` (default results/benchmarks) with the run's metadata."""
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
        """The first epoch untimed, then the median seconds of the next ``epochs``; and the first epoch's
        loss of the first trainer. ``fit(on_epoch)`` trains until every trainer has its epochs."""
        seconds, first = [], {}

        def on_epoch(*args):  # (report) from a trainer, (member, report) from a pack
            member, report = (0, args[0]) if len(args) == 1 else args
            if report.epoch == 1:
                first[member] = report.train_loss

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
        return float(np.median(seconds)), first[0]

    alone = Trainer(config(0), backend, D=D)
    alone_s, alone_loss = timed(lambda on_epoch: alone.fit(X_dev, None, on_epoch), [alone])
    log(f"one run alone: {alone_s:.4f} s an epoch")
    rows = []
    for R in runs:
        trainers = [Trainer(config(seed), backend, D=D) for seed in range(R)]
        pack = Pack(trainers)
        pack_s, loss = timed(lambda on_epoch: pack.fit(X_dev, None, on_epoch), trainers)
        if not np.isclose(loss, alone_loss, rtol=1e-4):  # checked on the first epoch, before the timed ones count
            raise KsaeError(f"pack of {R}: the run of seed 0 lost {loss} on its first epoch, alone {alone_loss}; "
                            f"the packed step is wrong here, nothing is reported")
        rows.append({"runs": R, "stacked": pack.stacked, "epoch_s": pack_s, "over_one_run": pack_s / alone_s,
                     "per_run_s": pack_s / R})
        log(f"pack of {R} ({'stacked' if pack.stacked else 'one after another'}): {pack_s:.4f} s an epoch, "
            f"{pack_s / alone_s:.2f}x one run")
    result = {"benchmark": "packed", "rows_per_epoch": int(X_nd.shape[0]), "D": D, "hidden": hidden, "k": k,
              "batch_size": batch_size, "timed_epochs": epochs, "alone_epoch_s": alone_s, "packs": rows,
              **run_metadata(backend)}
    result["path"] = str(write_results("packed", result, out_dir))
    return result
