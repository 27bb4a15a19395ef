"""The epoch engine: the one loop over epochs and the one loop over an epoch's steps, for every kind of run.

The k-sparse autoencoder's :class:`~ksae_cupy.training.trainer.Trainer` (ksae-train, the estimator, the
MPI trainers that subclass it), the baselines' :class:`~ksae_cupy.supervised.baseline_trainer.BaselineTrainer`
(ksae-baseline) and :class:`~ksae_cupy.supervised.finetune.FinetuneTrainer` (ksae-finetune) all train
through it. A trainer holds ``epoch``, ``step``, ``batch_in_epoch``, ``epoch_perm``, ``rng``,
``stop_requested``, ``finished`` and ``tally``, and brings its own step and its own report:

    run_epochs(trainer, run_epoch, on_epoch)     epochs until the run is finished or a stop is requested
    perm = begin_epoch(trainer, N)               the epoch's order (drawn once; kept mid-epoch)
    run_steps(trainer, n_batches, step, ...)     step(b) from batch trainer.batch_in_epoch on
    tally = end_epoch(trainer)                   counted, and the next epoch's state cleared

Every per-epoch statistic (loss sums, unit counts, the auxiliary loss, ...) goes into one
:class:`EpochTally`. A checkpoint written mid-epoch holds the tally (:meth:`EpochTally.state`), and
a resumed trainer restores it (:func:`restored_tally`), so the resumed epoch's metrics line is the
one an uninterrupted run logs. A checkpoint from before tallies restores none: that epoch's figures
then cover the batches after the resume only (:attr:`EpochTally.complete` is False, and the session
says so in one line). The functions at the end turn an autoencoder's tally into its epoch line's
fraction of variance explained (FVE) and L0.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.backend import array_module, to_host
from ksae_cupy.metrics import fve_from_sums


class EpochTally:
    """Sums of one epoch so far, by name: numbers (a loss summed over batches, a count) or arrays (per unit).

    ``complete`` is False for a tally that misses the batches before a resume (an older checkpoint)."""

    def __init__(self, values: dict | None = None, complete: bool = True):
        self.values = dict(values or {})
        self.complete = complete

    def add(self, name: str, value) -> None:
        """Add ``value`` to the sum ``name``; a None (a trainer that does not count it) makes it None."""
        old = self.values.get(name, 0)
        # 0 + x is x to the bit: the first batch's value is kept as it came.
        self.values[name] = None if old is None or value is None else old + value

    def get(self, name: str, default=0):
        return self.values.get(name, default)

    def mean(self, total: str, count: str) -> float | None:
        """``total / count`` as a host float; None when nothing was counted."""
        n, value = self.get(count), self.get(total)
        return None if value is None or not n else float(to_host(value)) / int(to_host(n))

    def state(self) -> dict:
        """Host arrays for a checkpoint: numbers as 0-d arrays (float64 or int64), arrays as they are. A sum
        that is None is left out (the trainer that does not count it makes it None again on resume)."""
        out = {}
        for name, value in self.values.items():
            if value is None:
                continue
            value = to_host(value)
            if np.ndim(value) == 0:
                value = np.asarray(value, dtype=np.int64 if np.asarray(value).dtype.kind in "iub" else np.float64)
            out[name] = np.asarray(value)
        return out

    @classmethod
    def from_state(cls, state: dict) -> "EpochTally":
        return cls({name: (value.item() if np.ndim(value) == 0 else np.array(value)) for name, value in state.items()})


    def on(self, backend) -> "EpochTally":
        """This tally with its arrays (per-unit counts) on ``backend``'s device, where the steps add to them."""
        self.values = {name: backend.asarray(value) if np.ndim(value) else value for name, value in self.values.items()}
        return self


def restored_tally(batch_in_epoch: int, saved: dict | None, legacy: dict | None = None) -> EpochTally:
    """The tally a trainer resumes with: empty at an epoch's start; mid-epoch the checkpoint's ``saved``
    state, else (a checkpoint from before tallies) ``legacy`` (what it did keep, e.g. the loss sum),
    marked incomplete."""
    if not batch_in_epoch:
        return EpochTally()
    if saved is not None:
        return EpochTally.from_state(saved)
    return EpochTally(legacy, complete=False)


def tally_state(trainer) -> dict | None:
    """What a checkpoint holds of the running epoch's tally: its state mid-epoch, else None."""
    return trainer.tally.state() if trainer.batch_in_epoch else None


def n_batches(N: int, batch_size: int) -> int:
    return -(-N // batch_size)  # the last, smaller batch is trained on too


def begin_epoch(trainer, N: int) -> np.ndarray:
    """The order of the epoch: drawn from the trainer's generator when it starts (a fresh tally with it),
    the checkpointed one when it resumes mid-epoch."""
    if trainer.epoch_perm is None:
        trainer.epoch_perm = trainer.rng.permutation(N)  # on every rank the same generator state
        trainer.batch_in_epoch = 0
        trainer.tally = EpochTally()
    return trainer.epoch_perm


def run_steps(trainer, n_batches: int, step, on_batch=None) -> bool:
    """``step(b)`` for the batches ``trainer.batch_in_epoch .. n_batches - 1``, each counted (``step``,
    ``batch_in_epoch``) and followed by ``on_batch(done, total)``. False when :attr:`stop_requested`
    stopped the epoch before its last batch (the trainer then says where it stands); True when it ran."""
    for b in range(trainer.batch_in_epoch, n_batches):
        step(b)
        count_batch(trainer, b)
        if on_batch is not None:
            on_batch(b + 1, n_batches)
        if trainer.stop_requested and b + 1 < n_batches:
            return False
    return True


def count_batch(trainer, b: int) -> None:
    """Count batch ``b`` of the epoch as trained (a step more)."""
    trainer.step += 1
    trainer.batch_in_epoch = b + 1


def end_epoch(trainer) -> EpochTally:
    """Count the finished epoch and clear what the next one starts from; the finished epoch's tally."""
    tally = trainer.tally
    trainer.epoch += 1
    trainer.batch_in_epoch, trainer.epoch_perm = 0, None
    trainer.tally = EpochTally()
    return tally


def run_epochs(trainer, run_epoch, on_epoch=None, after_epoch=None):
    """``run_epoch()`` until the trainer is finished or a stop is requested; each report to ``on_epoch``
    then ``after_epoch`` (a checkpoint). ``run_epoch`` returns None when stopped mid-epoch. Returns the
    last report (None when no epoch finished)."""
    last = None
    while not trainer.finished:
        report = run_epoch()
        if report is None:  # stopped mid-epoch
            break
        last = report
        if on_epoch is not None:
            on_epoch(report)
        if after_epoch is not None:
            after_epoch(report)
        if trainer.stop_requested:
            break
    return last


# -- what an autoencoder's epoch line derives from its tally -------------------------------------

def host_number(value):
    """A count or sum as a host number (it may sit on the device); None stays None."""
    return None if value is None else np.asarray(to_host(value)).item()


def code_nonzero(cache):
    """Non-zero units of a step's code (its kept values), on the device: a relu unit kept at 0 is not counted."""
    values = cache.val_nk if cache.val_nk is not None else cache.Zs_nh
    return array_module(values).count_nonzero(values)


def fraction_of_variance_explained(sq_error: float | None, spread: float | None) -> float | None:
    """The epoch's FVE from its summed squared error and the set's ``metrics.total_variance`` (one
    definition, :func:`ksae_cupy.metrics.fve_from_sums`); None where either was not counted."""
    if sq_error is None or spread is None:
        return None
    return fve_from_sums(sq_error, spread)
