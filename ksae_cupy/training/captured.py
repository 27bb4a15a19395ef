"""The GPU's captured step as a trainer runs it: the epoch's bookkeeping around the CUDA graphs.

On a GPU, :class:`~ksae_cupy.training.trainer.Trainer` replays its step as CUDA graphs: each epoch one graph
(:class:`~ksae_cupy.gpu.graph_epoch.EpochGraph`, the default), or one graph per step between cuBLAS products
(:class:`~ksae_cupy.gpu.graph_step.CapturedEpochs`, kept to compare). The graphs sum the epoch's loss and
per-unit counts on the device; :class:`CapturedRun` opens their epoch, runs its batches, and turns the
device's sums into the trainer's tally when the epoch ends or a checkpoint is written mid-epoch.
"""
from __future__ import annotations

import time

from ksae_cupy.gpu.graph_epoch import EpochGraph
from ksae_cupy.gpu.graph_step import CapturedEpochs
from ksae_cupy.training import epochs


class CapturedRun:
    """One trainer's captured graphs (``graphs``) and where the running epoch began in this session."""

    def __init__(self, trainer, xp, config, whole_epochs: bool, order_on_device: bool):
        if whole_epochs:
            self.graphs = EpochGraph(xp, trainer.params, trainer.optimizer.velocities, trainer.since_kept_h, config,
                                     order_on_device=order_on_device)
        else:
            self.graphs = CapturedEpochs(xp, trainer.params, trainer.optimizer.velocities, trainer.since_kept_h,
                                         config)
        self.start = None  # _Start of the running epoch

    def open(self, trainer, epoch: epochs.Epoch) -> None:
        """Begin the epoch's graphs: a fresh epoch on the epoch graph that draws orders draws it on the device
        (from the generator's state, which comes back with the order); else the order is drawn on the host (or
        the checkpoint's, resumed) and copied in."""
        graphs, X_train_nd = self.graphs, epoch.data[0]
        epoch.whole = graphs.runs_whole_epochs
        epoch.own["device_order"] = graphs.runs_whole_epochs and graphs.draws_orders and trainer.epoch_perm is None
        if epoch.own["device_order"]:
            trainer.batch_in_epoch, trainer.tally = 0, epochs.EpochTally()  # as draw_order starts an epoch
        else:
            epoch.order = epochs.draw_order(trainer, X_train_nd.shape[0])
        self.start = _Start(trainer.tally, trainer.batch_in_epoch, X_train_nd.shape[0], trainer.config.batch_size)
        graphs.begin(X_train_nd, epoch.k, trainer.tally.get("loss", 0.0))

    def take_step(self, trainer, epoch: epochs.Epoch, b: int) -> None:
        """Batch ``b`` (the epoch graph: every batch left) on the device; the parts count launch time (the
        GPU's own is in the epoch's total)."""
        graphs, X_train_nd, batch_size = self.graphs, epoch.data[0], trainer.config.batch_size
        t0 = time.perf_counter()
        if epoch.whole:
            graphs.run_epoch(X_train_nd, epoch.order, b, batch_size,
                             trainer.rng.bit_generator.state if epoch.own["device_order"] else None)
            self.start.before_last = graphs.loss_before_last()
            if epoch.own["device_order"]:  # the order drawn (for a checkpoint before the epoch ends), the generator after it
                trainer.epoch_perm, trainer.rng.bit_generator.state = graphs.drawn_order()
        else:
            if b == epoch.n_batches - 1:  # the loss before the last (maybe smaller) batch: one wait per epoch
                self.start.before_last = graphs.loss_sum()
            graphs.run(X_train_nd, epoch.order[b * batch_size:(b + 1) * batch_size])
        epoch.parts["steps"] += time.perf_counter() - t0

    def sync_tally(self, trainer, k: int) -> None:
        """The trainer's tally from the device's counters (they count this session's batches; the tally held the
        batches before when the epoch began here)."""
        start, graphs, cfg = self.start, self.graphs, trainer.config
        done = trainer.batch_in_epoch - start.first_batch  # this session's batches
        loss = graphs.loss_sum()
        session_examples = min(start.N, trainer.batch_in_epoch * start.batch_size) - start.first_batch * start.batch_size
        full = loss if start.before_last is None else start.before_last  # the loss of full batches
        sq_error = 2.0 * start.batch_size * (full - start.values.get("loss", 0.0)) + \
            (0.0 if start.before_last is None else 2.0 * (session_examples - (done - 1) * start.batch_size)
             * (loss - start.before_last))
        values = dict(start.values)
        values.update(loss=loss, batches=start.values.get("batches", 0) + done,
                      sq_error=start.values.get("sq_error", 0.0) + sq_error,
                      examples=start.values.get("examples", 0) + session_examples,
                      kept_h=start.values.get("kept_h", 0) + graphs.kept_count_h())
        # The captured step keeps no count of non-zero codes: linear units keep k, relu ones are not counted.
        values["nonzero"] = start.values.get("nonzero", 0) + session_examples * k if cfg.activation == "linear" \
            else None
        if cfg.aux_k:
            values.update(aux_loss=start.values.get("aux_loss", 0.0) + graphs.aux_loss_sum(),
                          aux_batches=start.values.get("aux_batches", 0) + done)
        trainer.tally.values = values

    def before_checkpoint(self, trainer) -> None:
        """Wait for the graphs (they run on a stream of their own; a checkpoint's copies run on the default
        one); mid-epoch, the tally from the device's counters so far."""
        self.graphs.loss_sum()
        if trainer.batch_in_epoch and self.start is not None:
            self.sync_tally(trainer, trainer.current_k())


class _Start:
    """Where a captured epoch began in this session: the tally then, the batch, the rows and batch size;
    ``before_last``, the device's loss sum read before the epoch's last batch (which may be smaller)."""

    def __init__(self, tally, first_batch: int, N: int, batch_size: int):
        self.values, self.first_batch, self.N, self.batch_size = dict(tally.values), first_batch, N, batch_size
        self.before_last = None
