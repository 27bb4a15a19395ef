"""Measure the largest learning rate at which the paper's training stays stable, per dataset (beyond the
paper, which gives one rate for MNIST: the measurements behind ``--lr auto``).

For each dataset (and MNIST / synthetic data rescaled by several factors) this trains the
paper's model (H 1000, k 100 as in the first epoch of the default schedule, or k 25;
batch 128, momentum 0.9, sigma 0.01) for ``--steps`` steps at each rate of a grid
auto_lr * 2^(i/2), and records the largest rate whose run stays finite and ends with a
loss below its first steps' (``stable``), beside the data's mean squared norm E||x||^2,
the top eigenvalue of E[x x^T], and ``--lr auto``'s rate (see
ksae_cupy/training/learning_rate.py and docs/lr-auto.md, whose table this writes).

    KSAE_DATA_DIR=/path/to/data bin/measure-lr --out results/measurements/lr-auto-measurements.json
"""
from __future__ import annotations

import math
import time

import numpy as np
from ksae_cupy import paper


def stable_at(X_nd, lr, k, steps, batch=paper.BATCH_SIZE, hidden=paper.HIDDEN, seed=0):
    """Whether ``steps`` steps at ``lr`` stay finite and end below the first steps' loss (the paper's
    model and dense step, one :meth:`Trainer.train_batch` a batch)."""
    from ksae_cupy.backend import CPU
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    config = TrainConfig(hidden=hidden, k=k, k_start=None, epochs=1, batch_size=batch, lr=lr, seed=seed, step="dense")
    trainer = Trainer(config, CPU, D=X_nd.shape[1])
    order = np.random.default_rng(seed).permutation(len(X_nd))
    losses = []
    for step in range(steps):
        rows = order[(step * batch) % len(X_nd):][:batch]
        loss = trainer.train_batch(X_nd[rows], k)
        if not math.isfinite(loss) or (losses and loss > 1e6 * losses[0]):
            return False
        losses.append(loss)
    return float(np.mean(losses[-20:])) < float(np.mean(losses[:5]))


def largest_stable(X_nd, k, steps, start, **model):
    """The largest rate of the grid start * 2^(i/2) that is stable, and the smallest that is not (``model``:
    :func:`stable_at`'s batch, hidden and seed)."""
    lr = start
    if stable_at(X_nd, lr, k, steps, **model):
        while stable_at(X_nd, lr * math.sqrt(2), k, steps, **model):
            lr *= math.sqrt(2)
        return lr, lr * math.sqrt(2)
    while not stable_at(X_nd, lr / math.sqrt(2), k, steps, **model):
        lr /= math.sqrt(2)
    return lr / math.sqrt(2), lr


def paper_cases(rows: int, log=lambda msg: None) -> list[tuple[int, str, np.ndarray]]:
    """``(k, name, X_nd)`` of every case measured: the first ``rows`` training rows of each dataset, and MNIST /
    synthetic data rescaled."""
    from ksae_cupy.datasets import load_dataset

    mnist = load_dataset("mnist", log=log).X_train[:rows]
    fashion = load_dataset("fashion-mnist", log=log).X_train[:rows]
    synthetic = load_dataset("synthetic", log=log).X_train[:rows]
    standardised = (mnist - mnist.mean(0)) / (mnist.std(0) + np.float32(0.1))
    # k 100: the first epoch of the default schedule (where runs diverge); k 25: no schedule.
    return [(100, "mnist", mnist), (100, "fashion-mnist", fashion), (100, "synthetic", synthetic),
            (100, "mnist x 0.25", mnist * np.float32(0.25)), (100, "mnist x 4", mnist * np.float32(4)),
            (100, "synthetic x 10", synthetic * np.float32(10)), (100, "mnist standardised", standardised),
            (25, "mnist", mnist), (25, "fashion-mnist", fashion), (25, "synthetic", synthetic)]


def measure(k: int, name: str, X_nd, steps: int, **model) -> dict:
    """One case's row: the data's statistics, ``--lr auto``'s rate and the largest stable rate of the grid
    from it (``model``: :func:`stable_at`'s batch, hidden and seed)."""
    from ksae_cupy.training.learning_rate import auto_learning_rate, mean_squared_norm, top_eigenvalue

    started = time.perf_counter()
    msq, top, auto = mean_squared_norm(X_nd), top_eigenvalue(X_nd), auto_learning_rate(X_nd)
    stable, unstable = largest_stable(X_nd, k, steps, start=auto, **model)
    return {"data": name, "k": k, "mean_sq_norm": round(msq, 3), "top_eigenvalue": round(top, 3),
            "largest_stable_lr": round(stable, 5), "first_unstable_lr": round(unstable, 5),
            "stable_lr_x_msq": round(stable * msq, 3), "stable_lr_x_top": round(stable * top, 3),
            "auto_lr": auto, "margin": round(stable / auto, 2), "seconds": round(time.perf_counter() - started, 1)}
