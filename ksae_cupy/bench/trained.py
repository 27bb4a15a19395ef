"""The trained model the CPU benchmarks time: what a user's run spends 4,990 of its 5,000 epochs on.

A fresh model is not what users run: after a few epochs at the paper's rate over half of the units are dead,
the codes are skewed and heavy-tailed (the top-k's candidate threshold misses on them), and the update's
velocities decay towards zero. So ``ksae-bench train`` starts its epochs and its step's parts from a trained
model: a run's checkpoint (``--from-run RUN``, e.g. a committed run restored with ``ksae-data
restore-checkpoint``), or one trained here to a stated epoch as ``ksae-train`` trains it: the paper's rate and
momentum, k from 100 down to k over the first half of those epochs (with 10 epochs, the quick start's model).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ksae_cupy import paper
from ksae_cupy.errors import KsaeError


@dataclasses.dataclass
class TrainedStart:
    """A checkpoint to start timed epochs and steps from, and how it was made (said in the results)."""

    checkpoint: object  # ksae_cupy.training.checkpoint.Checkpoint
    made: str

    @property
    def epoch(self) -> int:
        return self.checkpoint.epoch

    def host_state(self) -> tuple[dict, dict]:
        """``(params, velocities)``: float32 copies of the checkpoint's arrays, for a step timed outside a trainer."""
        return tuple({name: np.array(value, dtype=np.float32) for name, value in arrays.items()}
                     for arrays in (self.checkpoint.params, self.checkpoint.velocities))

    def config(self, k: int, more_epochs: int):
        """The run's configuration, k fixed at ``k``, with room for ``more_epochs`` epochs after the checkpoint's."""
        from ksae_cupy.training.config import TrainConfig

        config = TrainConfig.from_dict(self.checkpoint.config)
        return dataclasses.replace(config, k=k, k_start=None, epochs=self.checkpoint.epoch + more_epochs)

    def trainer(self, backend, D: int, k: int, more_epochs: int, trainer_class=None, **changes):
        """A trainer holding the trained parameters, velocities and dead-unit counts, ready for more epochs.
        ``trainer_class``: a subclass of :class:`~ksae_cupy.training.trainer.Trainer` (another GPU path);
        ``changes``: configuration fields to change (e.g. ``topk``)."""
        from ksae_cupy.training.trainer import Trainer

        config = dataclasses.replace(self.config(k, more_epochs), **changes)
        return (trainer_class or Trainer)(config, backend, D, checkpoint=self.checkpoint)


def fresh(backend, D: int, H: int, k: int, batch_size: int, topk: str, lr: float) -> TrainedStart:
    """The untrained model as a start at epoch 0: the initial weights ``ksae-train`` draws (seed 0), zero
    velocities, at ``lr`` and the paper's momentum, k fixed."""
    from ksae_cupy.training.config import TrainConfig
    from ksae_cupy.training.trainer import Trainer

    config = TrainConfig(hidden=H, k=k, k_start=None, epochs=1, batch_size=batch_size, topk=topk, lr=lr,
                         momentum=paper.MOMENTUM)
    return TrainedStart(Trainer(config, backend, D).checkpoint(), f"the initial weights ksae-train draws (seed 0), lr {lr}")


def from_run(run_dir: Path, D: int, H: int) -> TrainedStart:
    """The checkpoint of the run folder ``run_dir`` (its ``checkpoint.h5``), which must have ``D`` inputs and
    ``H`` units."""
    from ksae_cupy.training.checkpoint import load_checkpoint

    path = Path(run_dir) / "checkpoint.h5"
    if not path.is_file():
        raise KsaeError(f"--from-run {run_dir}: the folder holds no checkpoint.h5; give a run folder of ksae-train "
                        f"(a committed run: ksae-data restore-checkpoint first)")
    checkpoint = load_checkpoint(path)
    shape = tuple(checkpoint.params["W_dh"].shape)
    if shape != (D, H):
        raise KsaeError(f"--from-run {run_dir}: its W is {shape[0]} x {shape[1]}; the bench times D x H = {D} x {H} "
                        f"(give --dim {shape[0]} --hidden {shape[1]})")
    return TrainedStart(checkpoint, f"{run_dir} at epoch {checkpoint.epoch}")


def trained_here(backend, X_train, X_valid, H: int, k: int, batch_size: int, topk: str, epochs: int,
                 lr: float = paper.LR, log=print) -> TrainedStart:
    """A model trained for ``epochs`` epochs on ``X_train`` as ``ksae-train --epochs EPOCHS`` trains it: at ``lr``
    (the paper's rate; random rows, which diverge at it, take less) and the paper's momentum, k from the
    paper's 100 (clipped into [k, H]) down to k over the first half of the epochs, seed 0."""
    from ksae_cupy.schedules import resolve_k_start
    from ksae_cupy.training.config import TrainConfig
    from ksae_cupy.training.trainer import Trainer

    k_start = resolve_k_start("auto", k, H)
    config = TrainConfig(hidden=H, k=k, k_start=k_start, epochs=epochs, batch_size=batch_size, topk=topk, lr=lr,
                         momentum=paper.MOMENTUM)
    trainer = Trainer(config, backend, X_train.shape[1])
    X_train, X_valid = backend.asarray(X_train), backend.asarray(X_valid)
    for epoch in range(epochs):
        report = trainer.run_epoch(X_train, X_valid)
        log(f"training the bench's model: epoch {epoch + 1}/{epochs}, k {report.k}, loss {report.train_loss:.4f}, "
            f"unkept {report.dead_fraction:.1%}")
    return TrainedStart(trainer.checkpoint(), f"trained here: {epochs} epochs at lr {lr}, momentum {paper.MOMENTUM}, "
                                              f"k {k_start} down to {k} over the first half, seed 0")
