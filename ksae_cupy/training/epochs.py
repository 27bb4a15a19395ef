"""The epoch engine: the one loop over epochs and the one loop over an epoch's steps, for every kind of run.

The k-sparse autoencoder's :class:`~ksae_cupy.training.trainer.Trainer` (ksae-train, the estimator, the
MPI trainers that subclass it, and each member of a pack of runs), the baselines'
:class:`~ksae_cupy.supervised.baseline_trainer.BaselineTrainer` (ksae-baseline) and
:class:`~ksae_cupy.supervised.finetune.FinetuneTrainer` (ksae-finetune) all train through it. A trainer
holds ``config.batch_size``, ``backend``, ``epoch``, ``step``, ``batch_in_epoch``, ``epoch_perm``, ``rng``,
``stop_requested``, ``finished`` and ``tally``, and brings three methods of its own:

    trainer.open_epoch(epoch)         its step for the epoch, and the order (draw_order, or its own)
    trainer.take_step(epoch, b)       batch b: gradients, update, the tally
    trainer.close_epoch(epoch)        validation, health check, end_epoch; the epoch's report

The engine calls them, and counts the steps:

    epoch = open_epoch(trainer, data)     data: the arrays, e.g. (X_train_nd, X_valid_nd)
    step(trainer, epoch)                  the next batch, counted (step, batch_in_epoch)
    report = close_epoch(trainer, epoch)

    run_epochs(trainer, data, on_epoch, after_epoch, on_batch)   epochs until finished or a stop is requested
    run_interleaved(trainers, data, stop, failed, ...)            several trainers' epochs, a batch of each in turn

Every per-epoch statistic (loss sums, unit counts, the auxiliary loss, ...) goes into one
:class:`EpochTally`. A checkpoint written mid-epoch holds the tally (:meth:`EpochTally.state`), and
a resumed trainer restores it (:func:`restored_tally`), so the resumed epoch's metrics line is the
one an uninterrupted run logs. A checkpoint from before tallies restores none: that epoch's figures
then cover the batches after the resume only (:attr:`EpochTally.complete` is False, and the session
says so in one line). The functions at the end turn an autoencoder's tally into its epoch line's
fraction of variance explained (FVE) and L0.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np

from ksae_cupy.backend import array_module, to_host
from ksae_cupy.metrics import fve_from_sums, total_variance


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


@dataclass
class Epoch:
    """An open epoch: the arrays it trains on, its batches, the batch it began at, its clock and parts so far,
    and what the trainer chose for it when it opened (:meth:`open_epoch` of the trainer fills ``order``, ``k``,
    ``lanes`` and ``own``)."""

    data: tuple  # the arrays the epoch trains on, as the trainer's run_epochs was given them
    n_batches: int
    start: float
    parts: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    first_batch: int = 0
    order: object = None  # the epoch's row order on the device (None: drawn on the device, in the captured graph)
    k: int | None = None
    lanes: int = 1  # the threads its step splits its examples over; BLAS runs on one thread beside them
    whole: bool = False  # one take_step call trains every batch left (the GPU's epoch graph)
    own: dict = field(default_factory=dict)  # what the trainer keeps for its epoch (its step, its rate, ...)


# Seconds of an epoch's parts: "shuffle" (the order, and what the epoch prepares), "batches" (gathering each
# batch's rows), "steps" (forward and backward), "updates" (the optimizer), "validation".
PARTS = ("shuffle", "batches", "steps", "updates", "validation")


def draw_order(trainer, N: int):
    """The epoch's order on the trainer's device: drawn from its generator when the epoch starts (a fresh
    tally with it), the checkpointed one when it resumes mid-epoch."""
    if trainer.epoch_perm is None:
        trainer.epoch_perm = trainer.rng.permutation(N)  # on every rank the same generator state
        trainer.batch_in_epoch = 0
        trainer.tally = EpochTally()
    return trainer.backend.asarray(trainer.epoch_perm.astype(np.int64))


def open_epoch(trainer, data: tuple) -> Epoch:
    """Begin the trainer's epoch (or the rest of an interrupted one) on ``data``: its clock started, then the
    trainer's ``open_epoch(epoch)`` (its step, and the order: :func:`draw_order`, or its own)."""
    epoch = Epoch(data, n_batches(data[0].shape[0], trainer.config.batch_size), time.perf_counter())
    trainer.open_epoch(epoch)
    epoch.first_batch = trainer.batch_in_epoch
    epoch.parts["shuffle"] += time.perf_counter() - epoch.start
    return epoch


def step(trainer, epoch: Epoch) -> None:
    """Train the epoch's next batch (every batch left, for a trainer that trains the epoch whole), counted."""
    b = trainer.batch_in_epoch
    trainer.take_step(epoch, b)
    done = epoch.n_batches - b if epoch.whole else 1
    trainer.step += done
    trainer.batch_in_epoch = b + done


def close_epoch(trainer, epoch: Epoch):
    """End the epoch, its every batch trained: the trainer's ``close_epoch(epoch)`` (validation, health check,
    :func:`end_epoch`), its report."""
    return trainer.close_epoch(epoch)


def end_epoch(trainer) -> EpochTally:
    """Count the finished epoch and clear what the next one starts from; the finished epoch's tally."""
    tally = trainer.tally
    trainer.epoch += 1
    trainer.batch_in_epoch, trainer.epoch_perm = 0, None
    trainer.tally = EpochTally()
    return tally


def run_epochs(trainer, data: tuple, on_epoch=None, after_epoch=None, on_batch=None, limit: int | None = None):
    """Epochs of ``trainer`` on ``data`` until it is finished (or ``limit`` epochs ran) or a stop is requested.

    ``on_batch(done, total)`` after every batch; each epoch's report to ``on_epoch`` then ``after_epoch`` (a
    checkpoint). A stop requested mid-epoch returns at once (the trainer's ``batch_in_epoch`` and
    ``epoch_perm`` say where it stands); one requested during an epoch's last batch, after that epoch's
    report. Returns the last report (None when no epoch finished). NumPy's overflow and invalid-value
    warnings are off: a diverging run would print pages of them before its one line, and the trainers stop
    on a non-finite loss or parameter anyway."""
    last, ran = None, 0
    with trainer.backend.use(), np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        while (ran < limit) if limit is not None else not trainer.finished:
            epoch = open_epoch(trainer, data)
            with blas_threads(epoch.lanes):
                while trainer.batch_in_epoch < epoch.n_batches:
                    step(trainer, epoch)
                    if on_batch is not None:
                        on_batch(trainer.batch_in_epoch, epoch.n_batches)
                    if trainer.stop_requested and trainer.batch_in_epoch < epoch.n_batches:
                        return last
                last = close_epoch(trainer, epoch)
            ran += 1
            if on_epoch is not None:
                on_epoch(last)
            if after_epoch is not None:
                after_epoch(last)
            if trainer.stop_requested:
                break
    return last


def run_interleaved(trainers: list, data: list, stop, failed: dict, on_epoch=None, after_epoch=None,
                    step_all=None) -> None:
    """The epochs of several trainers at once, one batch of each open epoch in turn (a pack of runs,
    :mod:`ksae_cupy.training.packed`): the same three calls as :func:`run_epochs`, interleaved.

    ``data[i]``: trainer i's arrays. ``stop()``: whether to stop (the members then stand mid-epoch).
    ``failed``: member -> the :class:`~ksae_cupy.errors.TrainingDiverged` that stopped it (the others go on).
    ``step_all(open_epochs)``: one batch of every open epoch (a stacked step), else each by :func:`step`.
    Each member's report to ``on_epoch(i, report)`` then ``after_epoch(i, report)``."""
    from ksae_cupy.errors import TrainingDiverged

    blas = BlasSwitch()
    running = {}  # member -> its open Epoch
    try:
        while not stop():
            active = [i for i, t in enumerate(trainers) if i not in failed and not t.finished]
            if not active:
                break
            for i in active:
                if i not in running:
                    running[i] = open_epoch(trainers[i], data[i])
            if step_all is not None:
                step_all(running)
            else:
                for i, epoch in running.items():
                    blas.set(epoch.lanes)
                    try:
                        step(trainers[i], epoch)
                    except TrainingDiverged as exc:
                        failed[i] = exc
            for i in [i for i, epoch in running.items()
                      if i in failed or trainers[i].batch_in_epoch == epoch.n_batches]:
                epoch = running.pop(i)
                if i in failed:
                    continue
                blas.set(epoch.lanes)
                try:
                    report = close_epoch(trainers[i], epoch)
                except TrainingDiverged as exc:
                    failed[i] = exc
                    continue
                if on_epoch is not None:
                    on_epoch(i, report)
                if after_epoch is not None:
                    after_epoch(i, report)
    finally:
        blas.close()


def blas_threads(lanes: int):
    """BLAS on one thread while a step runs in ``lanes`` > 1 (each lane computes its own rows of ``X W``);
    else BLAS's own threads."""
    if lanes == 1:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=1, user_api="blas")


class BlasSwitch:
    """BLAS's threads for interleaved epochs, each as its run alone has them (products differ in their last bits
    on another count): changed only when an epoch wants another limit than the last (setting it costs more
    than a small step)."""

    def __init__(self):
        self._scope, self._one_thread = contextlib.ExitStack(), False

    def set(self, lanes: int) -> None:
        one_thread = lanes != 1
        if one_thread != self._one_thread:
            self._scope.close()
            self._scope = contextlib.ExitStack()
            if one_thread:
                self._scope.enter_context(blas_threads(lanes))
            self._one_thread = one_thread

    def close(self) -> None:
        self._scope.close()


# -- what an autoencoder's epoch line derives from its tally -------------------------------------

def host_number(value):
    """A count or sum as a host number (it may sit on the device); None stays None."""
    return None if value is None else np.asarray(to_host(value)).item()


def code_nonzero(cache):
    """Non-zero units of a step's code (its kept values), on the device: a relu unit kept at 0 is not counted."""
    values = cache.val_nk if cache.val_nk is not None else cache.Zs_nh
    return array_module(values).count_nonzero(values)


class SpreadCache:
    """Each set's ``sum ||x - mean||^2`` (:func:`ksae_cupy.metrics.total_variance`, the FVE's denominator),
    computed once: a pass over MNIST's rows costs a third of an epoch, and every epoch's FVE divides by it.
    A set is known by identity (the array, held: a freed array's id may come again); the last few are kept."""

    def __init__(self, keep: int = 4):
        self.keep, self._sets = keep, []  # [(array, its spread)], the latest last

    def of(self, X_nd) -> float | None:
        if X_nd is None:
            return None
        for array, spread in self._sets:
            if array is X_nd:
                return spread
        spread = total_variance(X_nd)
        self._sets = self._sets[1 - self.keep:] + [(X_nd, spread)]
        return spread


def fraction_of_variance_explained(sq_error: float | None, spread: float | None) -> float | None:
    """The epoch's FVE from its summed squared error and the set's ``metrics.total_variance`` (one
    definition, :func:`ksae_cupy.metrics.fve_from_sums`); None where either was not counted."""
    if sq_error is None or spread is None:
        return None
    return fve_from_sums(sq_error, spread)
