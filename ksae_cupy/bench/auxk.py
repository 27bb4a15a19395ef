"""Time one training step (gradients and momentum update) with the AuxK loss against the paper's step (beyond
the paper: the dead-unit remedy of issue 35; the step-cost table of the handbook's dead-units page).

Both steps run as the trainer runs them (the sparse step at k = 25 of H = 1000 on the CPU kernels, W's gradient
deferred into the update, BLAS and the kernels on ``--threads``), on scratch copies of the same parameters and
the same MNIST batch, interleaved round by round so that load from other jobs falls on both alike. The AuxK
step's cost grows with the dead units it reconstructs from, ``min(aux_k, dead units)`` per example, so it is
timed at several dead fractions (units drawn at random); ``--checkpoint`` takes the parameters of a run
(else the paper's initial weights: the selected units' values then differ, the work does not).

    KSAE_DATA_DIR=/root/data bin/bench-auxk --aux-k 256 --dead 0,0.01,0.05,0.135,0.45 --out auxk-bench.json
"""
from __future__ import annotations

import statistics
import time

import numpy as np
from ksae_cupy import paper

CLOCKS = {"process": time.process_time, "wall": time.perf_counter}


def auxk_trainer(X_nd, k: int, aux_k: int, hidden: int = paper.HIDDEN, checkpoint=None):
    """A CPU :class:`Trainer` of the paper's model with AuxK on (the parameters of ``checkpoint``, a run's
    checkpoint.h5, when given; else the paper's initial weights)."""
    from ksae_cupy.backend import CPU
    from ksae_cupy.training.checkpoint import load_checkpoint
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    config = TrainConfig(hidden=hidden, k=k, k_start=None, epochs=1, aux_k=aux_k)
    trainer = Trainer(config, CPU, D=X_nd.shape[1])
    if checkpoint:
        for name, value in load_checkpoint(checkpoint).params.items():
            trainer.params[name][...] = value
    return trainer


def step_seconds(trainer, X_nd, k: int, auxk: bool, clock=time.process_time, steps: int = 5) -> float:
    """Median seconds of one step on scratch copies of the parameters (as Trainer.step_seconds times it)."""
    from ksae_cupy.momentum_sgd import MomentumSGD

    config = trainer.config
    params = {name: value.copy(order="K") for name, value in trainer.params.items()}
    optimizer = MomentumSGD(params, config.momentum, np)
    update = trainer.update_for(k)
    times = []
    with trainer.blas_for(k):
        for _ in range(steps + 1):  # the first call may compile or warm caches: not counted
            start = clock()
            # The step as trained: with the auxiliary loss on the units dead now, or the paper's.
            _, _, grads, _ = trainer._batch_gradients(X_nd, k, dead_h=trainer.dead_h() if auxk else None,
                                                      params=params)
            update(optimizer, params, grads, config.lr)  # as the trainer applies it (W's gradient in parts)
            times.append(clock() - start)
    return float(np.median(times[1:]))


def time_dead_fractions(trainer, X_nd, k: int, dead_fractions, rounds: int, clock=time.process_time,
                        log=print, seed: int = 0) -> list[dict]:
    """One row per dead fraction: the paper's step and the AuxK step, ``rounds`` interleaved rounds each, with
    that fraction of the hidden units marked dead (drawn at random); ``log`` gets one line per row."""
    hidden, aux_k = trainer.config.hidden, trainer.config.aux_k
    rng = np.random.default_rng(seed)
    results = []
    for fraction in dead_fractions:
        dead = rng.choice(hidden, int(round(fraction * hidden)), replace=False)
        trainer.since_kept_h[...] = 0
        trainer.since_kept_h[dead] = trainer.config.dead_window
        plain, aux = [], []
        for _ in range(rounds):
            plain.append(step_seconds(trainer, X_nd, k, auxk=False, clock=clock))
            aux.append(step_seconds(trainer, X_nd, k, auxk=True, clock=clock))
        ratios = [a / p for a, p in zip(aux, plain)]
        row = {"dead_fraction": fraction, "dead_units": len(dead), "aux_units_per_example": min(aux_k, len(dead)),
               "plain_ms": 1e3 * statistics.median(plain), "auxk_ms": 1e3 * statistics.median(aux),
               "ratio_median": statistics.median(ratios), "ratio_of_medians": statistics.median(aux) / statistics.median(plain)}
        results.append(row)
        log(f"dead {100 * fraction:5.1f}% ({len(dead)} units, {row['aux_units_per_example']} per example): "
            f"paper's step {row['plain_ms']:.2f} ms, AuxK {row['auxk_ms']:.2f} ms, ratio {row['ratio_median']:.2f} "
            f"(median of {rounds} interleaved rounds)")
    return results
