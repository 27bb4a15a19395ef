"""The training loop: shuffled minibatches, the sparsity schedule, momentum SGD, checkpoints.

:class:`~ksae_cupy.training.config.TrainConfig` (in config.py, re-exported here) holds every option
that shapes a run (it is saved in checkpoints); :class:`Trainer` owns the parameters, velocities
and random state on one backend and runs epochs. It never prints: it reports each epoch to a callback, so the CLI and the Python
API decide what to show and where to write.

Determinism: the initial weights and each epoch's order come from one NumPy generator on
the host, so a CPU run and a GPU run with one seed see the same batches, and a resumed run
continues the very same sequence (the generator's state, and mid-epoch the epoch's order,
are saved in the checkpoint).

The epochs are :mod:`ksae_cupy.training.epochs`' (the engine calls :meth:`Trainer.open_epoch`,
:meth:`~Trainer.take_step` and :meth:`~Trainer.close_epoch`); the step's functions are
:mod:`ksae_cupy.training.steps`'; on a GPU the captured graphs' bookkeeping is
:mod:`ksae_cupy.training.captured`'s. The trainer keeps the parameters, the optimizer and the step, with
the state a bit-identical resume needs (random state, the epoch's place and tally).

Over 400 lines: the one trainer every run kind builds on (the distributed trainers subclass it), with its
epoch's report and health check beside the state they read.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from ksae_cupy import model
from ksae_cupy.backend import Backend, to_host
from ksae_cupy.cpu.sparse_encoder import RunInputs
from ksae_cupy.gpu.graph_step import graph_step_applies
from ksae_cupy.training import epochs
from ksae_cupy.training.captured import CapturedRun
from ksae_cupy.training.checkpoint import Checkpoint
from ksae_cupy.errors import KsaeError, OptionError, TrainingDiverged  # TrainingDiverged is re-exported here
# TrainConfig lives in config.py; still imported from here by callers (training.trainer.TrainConfig).
from ksae_cupy.training.config import TrainConfig  # noqa: F401 (re-export)
from ksae_cupy import optimizers
from ksae_cupy.schedules import sparsity_at_epoch
from ksae_cupy.sparse_step import choose_step, sparse_layout
from ksae_cupy.training.steps import resolve_evaluation, resolve_steps, step_kind


class _Diverged(TrainingDiverged, OptionError):
    """A divergence whose advice names the rate: ``lr`` in Python, ``--lr`` on a command line."""

    def __init__(self, template: str):
        OptionError.__init__(self, "lr", template)
        self.loss = self.epoch = self.step = self.lr = None


@dataclass
class EpochReport:
    """What one epoch did; the CLI logs it and writes it to ``metrics.jsonl``."""

    epoch: int  # 1-based number of the epoch just finished
    step: int
    k: int
    lr: float
    train_loss: float  # mean over the epoch's batches of 0.5 ||x - xhat||^2 per example
    valid_loss: float | None
    dead_fraction: float  # hidden units kept by no example during the epoch
    samples_per_s: float
    seconds: float  # the epoch's batches (the steps and what feeds them), without the validation pass
    # Seconds of the epoch's parts: "shuffle" (the permutation), "batches" (gathering each batch's
    # rows), "steps" (forward and backward), "updates" (momentum SGD), "validation".
    parts: dict = dataclasses.field(default_factory=dict)
    # Units no example kept in the last dead_window examples, at the end of the epoch (counted
    # since the run started, so 0 until dead_window examples have been trained on).
    dead_window_fraction: float | None = None
    # With aux_k: the mean auxiliary loss of the epoch's batches.
    aux_loss: float | None = None
    # Fraction of variance explained, 1 - sum ||x - xhat||^2 / sum ||x - mean(x)||^2, over the epoch's
    # examples (as the steps saw them, the parameters changing) and over the validation rows (their own mean).
    fve: float | None = None
    valid_fve: float | None = None
    # L0: the mean count of non-zero code units per example (k for linear units, the top-k keeps k;
    # fewer with relu units, where a kept unit may be 0). None where a trainer does not count them.
    l0: float | None = None
    valid_l0: float | None = None


def _epoch_report(trainer, epoch, tally, seconds: float, samples: int, valid_loss, valid_l0) -> EpochReport:
    """The report of the epoch just counted, from its tally (:meth:`Trainer.close_epoch`)."""
    # Host numbers (a count may sit on the device); the same on every rank of a distributed trainer.
    sq_error, nonzero, examples = (epochs.host_number(tally.get(name, 0))
                                   for name in ("sq_error", "nonzero", "examples"))
    return EpochReport(
        epoch=trainer.epoch, step=trainer.step, k=epoch.k, lr=trainer.config.lr,
        train_loss=tally.mean("loss", "batches") or 0.0,
        valid_loss=valid_loss,
        dead_fraction=trainer._dead_fraction(tally.get("kept_h")),
        samples_per_s=samples / seconds if seconds > 0 else float("inf"),
        seconds=seconds,
        parts={name: round(value, 4) for name, value in epoch.parts.items()},
        dead_window_fraction=trainer.dead_window_fraction() if trainer.tracks_dead_units else None,
        aux_loss=(tally.mean("aux_loss", "aux_batches") or 0.0) if trainer.config.aux_k else None,
        fve=epochs.fraction_of_variance_explained(sq_error, trainer._spreads.of(epoch.data[0])),
        valid_fve=None if valid_loss is None else
        epochs.fraction_of_variance_explained(2.0 * valid_loss * epoch.data[1].shape[0], trainer._spreads.of(epoch.data[1])),
        l0=None if nonzero is None or not examples else nonzero / examples,
        valid_l0=valid_l0,
    )


def _check_health(trainer, loss_sum: float, valid_loss: float | None) -> None:
    """Stop as diverged when the epoch's summed loss or the validation loss is not finite
    (each batch's loss was finite, but their sum or a whole split's error can overflow:
    e.g. unscaled integer data) or when the parameters hold NaN or infinities; raised
    before the epoch is counted, so nothing of it is logged or checkpointed."""
    where = f"at epoch {trainer.epoch + 1} (step {trainer.step})"
    hint = f"nothing was saved after the last good checkpoint; try a smaller {{name}} (now {trainer.config.lr}) or scaled data"
    if not math.isfinite(loss_sum):
        raise _Diverged(f"the training loss summed over the epoch became {loss_sum} {where}; {hint}")
    if valid_loss is not None and not math.isfinite(valid_loss):
        raise _Diverged(f"the validation loss became {valid_loss} {where}; {hint}")
    trainer.check_params_finite()


class Trainer:
    """Parameters, velocities and random state of one run, resident on ``backend``."""

    # Whether this trainer's _batch_gradients takes the sparse step when the step option resolves to it
    # (then W is stored in Fortran order for it). The distributed trainers take the dense step.
    takes_sparse_step = True
    # Whether this trainer counts, per unit, the examples since one last kept it (the dead-window
    # metric and AuxK's dead units); the distributed trainers hold blocks of units or of examples: not yet.
    tracks_dead_units = True
    # Whether, on a GPU, this trainer replays its step as a CUDA graph (ksae_cupy.gpu.graph_step) when
    # the step applies; the distributed trainers communicate inside their step: not.
    captures_gpu_step = True
    # Whether the captured GPU step runs each epoch as one CUDA graph (ksae_cupy.gpu.graph_epoch: our product
    # kernels, no host work per step); False: the step graphs between cuBLAS products (graph_step), kept to compare.
    gpu_epoch_graph = True
    # With the epoch graph: a fresh epoch's order drawn in it (ksae_cupy.gpu.shuffle, NumPy's bit for bit), else on the host.
    gpu_order_on_device = True

    def __init__(self, config: TrainConfig, backend: Backend, D: int, checkpoint: Checkpoint | None = None):
        config.check()  # validated here unless the caller already did (a command validates its options once)
        if config.lr == "auto":  # a programming error, not the user's: the callers resolve it
            raise ValueError("TrainConfig.lr 'auto' must be resolved from the data before training")
        self.config = config
        self.backend = backend
        self.dtype = np.dtype(config.dtype)
        xp = backend.xp
        # On a GPU, the paper's step is captured once as a CUDA graph and replayed per batch.
        self._optimizer = optimizers.lookup(config.optimizer)  # its entry: how to build it, its updates
        self._captures = backend.is_gpu and self.captures_gpu_step and graph_step_applies(config) \
            and self._optimizer.captured
        if checkpoint is None:
            self.rng = np.random.default_rng(config.seed)
            host_params = model.init_params(D, config.hidden, config.sigma, self.rng, self.dtype)
            self.params = self._resident(host_params)
            self.optimizer = self._optimizer.make(self.params, config, xp)
            self.epoch, self.step, self.batch_in_epoch, self.epoch_perm = 0, 0, 0, None
            since_kept_h = np.zeros(config.hidden, dtype=np.int64)
        else:
            self.rng = np.random.default_rng()
            self.rng.bit_generator.state = checkpoint.rng_state
            self.params = self._resident(checkpoint.params)
            self.optimizer = self._optimizer.make(self.params, config, xp)
            for name, value in checkpoint.velocities.items():
                self.optimizer.velocities[name][...] = backend.asarray(value)
            self.epoch, self.step = checkpoint.epoch, checkpoint.step
            self.batch_in_epoch, self.epoch_perm = checkpoint.batch_in_epoch, checkpoint.epoch_perm
            # Checkpoints from before the dead-unit state: as at the start of a run.
            since_kept_h = checkpoint.units.get("since_kept_h", np.zeros(config.hidden, dtype=np.int64))
        # Per hidden unit: examples trained on since an example last kept it (dead at dead_window).
        self.since_kept_h = backend.asarray(np.asarray(since_kept_h, dtype=np.int64))
        # The unfinished epoch's statistics so far (a mid-epoch checkpoint's): its report then covers every
        # batch. A checkpoint from before tallies kept the loss only (ksae_cupy.training.epochs).
        self.tally = epochs.restored_tally(self.batch_in_epoch, None if checkpoint is None else checkpoint.epoch_tally,
                                           None if checkpoint is None else
                                           {"loss": checkpoint.epoch_loss_sum, "batches": checkpoint.epoch_loss_batches}
                                           ).on(backend)
        # Each set's sum ||x - mean||^2 (the FVE's denominators), once per set and run (a pass over its rows).
        self._spreads = epochs.SpreadCache()
        self._batch_nonzero = None  # the last batch's count of non-zero code units (relu units)
        self.stop_requested = False  # set (e.g. by a SIGINT handler) to stop after the current step
        # The functions each batch calls, chosen once here (ksae_cupy.training.steps); an epoch picks
        # the step of its k, and reads the lanes it runs in when it starts.
        self._steps = resolve_steps(config, xp, W_in_rows=bool(self.params["W_dh"].flags.f_contiguous),
                                    sparse=self.takes_sparse_step, optimizer=self._optimizer)
        self._evaluation = resolve_evaluation(config, xp)
        # The inputs' CSR form, built once per set, where they are sparse enough for the encoder to run
        # from their non-zeros (ksae_cupy.cpu.sparse_encoder); else BLAS's X W.
        self._inputs = RunInputs(applies=xp is np and self.takes_sparse_step)
        self._epoch_step = None  # (k, Step, lanes) of the epoch running
        # On a GPU, the step captured as CUDA graphs, and its epoch's bookkeeping (ksae_cupy.training.captured).
        self._capture = CapturedRun(self, xp, config, self.gpu_epoch_graph, self.gpu_order_on_device) \
            if self._captures else None

    @property
    def _captured(self):
        """The captured CUDA graphs (:mod:`ksae_cupy.gpu.graph_epoch` or :mod:`~ksae_cupy.gpu.graph_step`), or None."""
        return None if self._capture is None else self._capture.graphs

    def _resident(self, host_params):
        """The parameters on the backend; ``W_dh`` in the memory order of the step at the target k
        (the sparse step wants Fortran order; see :func:`ksae_cupy.sparse_step.sparse_layout`)."""
        params = {name: self.backend.asarray(value) for name, value in host_params.items()}
        if self.takes_sparse_step and not self._captures \
                and choose_step(self.config.step, self.config.k, self.config.hidden) == "sparse":
            params["W_dh"] = sparse_layout(params["W_dh"])
        if self._captures:  # the captured steps read W in C order (a CPU run's checkpoint may hold it in Fortran order)
            params["W_dh"] = self.backend.xp.ascontiguousarray(params["W_dh"])
        return params

    def share_arrays(self, params: dict, velocities: dict, since_kept_h) -> None:
        """Train on ``params``, ``velocities`` and ``since_kept_h`` from now on: arrays holding this run's values
        (a pack of runs stepped as one stacked model, :mod:`ksae_cupy.training.packed`, gives views of its
        stacked arrays). A captured step was built on the old arrays: it is dropped, the pack steps this run."""
        self.params = params
        self.optimizer.velocities = velocities
        self.since_kept_h = since_kept_h
        self._captures, self._capture = False, None

    @property
    def finished(self) -> bool:
        return self.epoch >= self.config.epochs

    def current_k(self) -> int:
        cfg = self.config
        return sparsity_at_epoch(self.epoch, cfg.k_schedule_epochs or cfg.epochs, cfg.k, cfg.k_start)

    def fit(self, X_train_nd, X_valid_nd=None, on_epoch=None, on_batch=None, should_checkpoint=None,
            checkpoint=None) -> EpochReport | None:
        """Train the remaining epochs on device arrays, or until :attr:`stop_requested`; the last
        epoch's report (None when no epoch finished).

        After every epoch: ``on_epoch(report)``, then ``checkpoint()`` when ``should_checkpoint(epoch)``
        says so (the caller saves: a file, a run folder, every rank). ``on_batch(done, total)`` after
        every batch. A stop requested mid-epoch returns at once; one requested during the last batch of
        an epoch, after that epoch's report and checkpoint (:func:`ksae_cupy.training.epochs.run_epochs`).
        """
        def after_epoch(report):
            if checkpoint is not None and should_checkpoint is not None and should_checkpoint(report.epoch):
                checkpoint()

        self._spread_of(X_train_nd, X_valid_nd)
        return epochs.run_epochs(self, (X_train_nd, X_valid_nd), on_epoch, after_epoch, on_batch)

    def run_epoch(self, X_train_nd, X_valid_nd=None, on_batch=None) -> EpochReport | None:
        """Train one epoch (or the rest of an interrupted one) on device arrays; its report, or None when
        :attr:`stop_requested` stopped it midway (then :attr:`batch_in_epoch` and :attr:`epoch_perm` say
        where it stands). ``on_batch(done, total)`` after every batch (for a progress bar)."""
        self._spread_of(X_train_nd, X_valid_nd)
        return epochs.run_epochs(self, (X_train_nd, X_valid_nd), on_batch=on_batch, limit=1)

    def _spread_of(self, *sets) -> None:
        """The sets' spreads, computed (once) before an epoch's BLAS limit: BLAS sums them on its own threads."""
        with self.backend.use():
            for X_nd in sets:
                self._spreads.of(X_nd)

    def _step_and_lanes(self, k: int):
        """``(k, Step, lanes)``: the step this trainer takes at ``k`` and the lanes it runs in now
        (:mod:`ksae_cupy.cpu.lanes`: the kernels' thread count for the sparse step on the CPU kernels,
        else 1, Numba's or the GPU's own parallelism)."""
        step = self._steps[step_kind(self.config, k, self.takes_sparse_step)]
        return k, step, step.lanes()

    def _at(self, k: int):
        """``(Step, lanes)`` at ``k``: the running epoch's, else resolved now (a caller outside an epoch)."""
        _, step, lanes = self._epoch_step if self._epoch_step is not None and self._epoch_step[0] == k \
            else self._step_and_lanes(k)
        return step, lanes

    def update_for(self, k: int):
        """The momentum update this trainer applies after a step at ``k``: ``update(optimizer, params, grads, lr)``
        (on the CPU kernels it takes the step's gradients as they come, ``W``'s in parts for the sparse step)."""
        return self._at(k)[0].update

    def blas_for(self, k: int):
        """BLAS on one thread while the step at ``k`` runs in lanes (each lane its own rows of ``X W``); else nothing."""
        return epochs.blas_threads(self._at(k)[1])

    # -- the engine's three calls (ksae_cupy.training.epochs) -----------------------------------------
    def open_epoch(self, epoch: epochs.Epoch) -> None:
        """The epoch's k (the sparsity schedule's), its step and lanes, and its order; on the CPU kernels the
        set in CSR form for the sparse encoder (built on the run's first epoch, timed in its "shuffle" part)."""
        if self.config.aux_k and not self.tracks_dead_units:
            raise KsaeError(f"aux_k {self.config.aux_k}: the auxiliary loss is not available in the distributed "
                            f"trainers yet; train with one process, or without it")
        self._epoch_step = epoch.k, epoch.own["step"], epoch.lanes = self._step_and_lanes(self.current_k())
        X_train_nd = epoch.data[0]
        if self._capture is not None:
            self._capture.open(self, epoch)
            return
        epoch.order = epochs.draw_order(self, X_train_nd.shape[0])
        epoch.own["rows"] = self._inputs.of(X_train_nd, self.dtype) if epoch.own["step"].in_lanes else None

    def take_step(self, epoch: epochs.Epoch, b: int) -> None:
        """Batch ``b`` of the epoch: its rows gathered, the gradients, the update, the epoch's tally."""
        if self._capture is not None:
            return self._capture.take_step(self, epoch, b)
        clock, cfg, parts, k = time.perf_counter, self.config, epoch.parts, epoch.k
        t0 = clock()
        rows = epoch.order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
        sparse_X = epoch.own["rows"]
        X_rows = None if sparse_X is None else sparse_X.rows(rows)
        X_nd = epoch.data[0][rows]  # a copy of the rows
        t1 = clock()
        self._batch_nonzero = None
        loss, aux_loss, grads, kept_h = self._batch_gradients(X_nd, k, X_rows, self.dead_h() if cfg.aux_k else None)
        if not math.isfinite(loss):
            raise TrainingDiverged(f"the loss became {loss} at epoch {self.epoch + 1}, step {self.step + 1} with "
                                   f"learning rate {cfg.lr}", loss, self.epoch + 1, self.step + 1, cfg.lr)
        t2 = clock()
        epoch.own["step"].update(self.optimizer, self.params, grads, cfg.lr)
        parts["batches"] += t1 - t0
        parts["steps"] += t2 - t1
        parts["updates"] += clock() - t2  # on a GPU the parts are launch times until the epoch's synchronize
        if aux_loss is not None:
            self.tally.add("aux_loss", aux_loss)
            self.tally.add("aux_batches", 1)
        self.count_step(loss, X_nd.shape[0], k, kept_h)

    def close_epoch(self, epoch: epochs.Epoch) -> EpochReport:
        """End the epoch, its every batch trained: the validation pass, the health check, the epoch counted;
        its report."""
        cfg, clock, k, parts = self.config, time.perf_counter, epoch.k, epoch.parts
        X_train_nd, X_valid_nd = epoch.data
        N, n_batches, first_batch, start = X_train_nd.shape[0], epoch.n_batches, epoch.first_batch, epoch.start
        if self._capture is not None:
            self._capture.sync_tally(self, k)
        self.backend.synchronize()
        seconds = clock() - start
        samples = min(N, n_batches * cfg.batch_size) - first_batch * cfg.batch_size
        t0 = clock()
        valid_loss = self.evaluate_loss(X_valid_nd, k) if X_valid_nd is not None else None
        valid_l0 = self.code_l0(X_valid_nd, k) if X_valid_nd is not None else None
        parts["validation"] = clock() - t0
        tally = self.tally
        _check_health(self, float(tally.get("loss", 0.0)), valid_loss)
        epochs.end_epoch(self)
        self._epoch_step = None
        return _epoch_report(self, epoch, tally, seconds, samples, valid_loss, valid_l0)

    def count_step(self, loss: float | None, n: int, k: int, kept_h) -> None:
        """Add one step's figures to the epoch's tally: its loss on ``n`` examples at ``k``, and how many of them
        kept each unit (``kept_h``), in the tally and the dead-unit counts. ``loss`` and ``kept_h`` None: a pack
        counts the losses and the per-unit counts of all its runs at once, on the device (``training/packed.py``)."""
        cfg, tally = self.config, self.tally
        tally.add("batches", 1)
        tally.add("examples", n)
        # Linear units: the k kept; relu units: those of them above 0 (None where a trainer did not count).
        tally.add("nonzero", n * k if cfg.activation == "linear" else self._batch_nonzero)
        if loss is not None:
            tally.add("loss", loss)
            tally.add("sq_error", 2.0 * loss * n)  # the loss is 0.5 ||x - xhat||^2 averaged over the batch
        if kept_h is not None:
            tally.add("kept_h", kept_h)
            self._note_kept(kept_h, n)

    def check_params_finite(self) -> None:
        """Raise :class:`TrainingDiverged` if a parameter holds NaN or infinities (a checkpoint
        of such a model must never replace a good one)."""
        for name, value in self.params.items():
            if not bool(self.backend.xp.isfinite(value).all()):
                raise _Diverged(f"{name} holds NaN or infinite values after step {self.step}; the run diverged "
                                f"and nothing was saved after the last good checkpoint; try a smaller {{name}} "
                                f"(now {self.config.lr}) or scaled data")

    def _batch_gradients(self, X_nd, k: int, X_rows=None, dead_h=None, params=None):
        """``(loss, aux_loss, grads, kept_h)`` for one minibatch: the loss, with ``dead_h`` the auxiliary loss on
        those units (else None), the gradients to step with, and how many examples kept each hidden unit.
        ``X_rows``: the batch's rows of its set's CSR form (the sparse encoder's). The one hook where
        subclasses communicate."""
        step, lanes = self._at(k)
        # On the CPU kernels the sparse step may hand W's gradient over in parts, for step.update to apply.
        loss, aux_loss, grads, cache = step.gradients(self.params if params is None else params, X_nd, k, lanes,
                                                      X_rows, dead_h)
        kept_h = self.backend.xp.bincount(cache.idx_nk.ravel(), minlength=self.config.hidden)
        # relu units: the kept ones above 0, counted; linear ones keep n * k, which the tally adds without a count
        self._batch_nonzero = None if self.config.activation == "linear" else epochs.code_nonzero(cache)
        return loss, aux_loss, grads, kept_h

    def _note_kept(self, kept_h, n_examples: int) -> None:
        """Count ``n_examples`` more for every unit this batch kept in no example; reset those it kept."""
        if not self.tracks_dead_units:
            return
        self.since_kept_h += n_examples
        self.since_kept_h[kept_h > 0] = 0

    def dead_h(self):
        """Mask of the units no example kept in the last ``dead_window`` examples."""
        return self.since_kept_h >= self.config.dead_window

    def dead_window_fraction(self) -> float:
        """The fraction of units dead over the last ``dead_window`` examples (:meth:`dead_h`)."""
        return float(to_host(self.dead_h().mean()))

    def train_batch(self, X_nd, k: int | None = None, lr: float | None = None) -> float:
        """One step on the batch ``X_nd`` outside the epoch loop (a tool probing a rate, as
        bin/measure-lr does): the gradients at ``k`` (the current k), then, when the loss is finite,
        the update at ``lr`` (the run's). Returns the batch's loss; counts nothing (epoch, step,
        dead units). The step and update are the ones an epoch at that k takes."""
        k = self.current_k() if k is None else k
        step, lanes = self._at(k)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"), epochs.blas_threads(lanes):
            loss, _, grads, _ = self._batch_gradients(X_nd, k)
            if math.isfinite(loss):
                step.update(self.optimizer, self.params, grads, self.config.lr if lr is None else lr)
        return loss

    def step_seconds(self, X_nd, k: int, steps: int = 5) -> float:
        """Median seconds of one training step (gradients and momentum update) at ``k`` on the
        batch ``X_nd``, taken on scratch copies: the run's parameters and velocities are untouched.
        The progress estimate calls it to learn how a step's cost changes with k."""
        params = {name: value.copy(order="K") for name, value in self.params.items()}
        optimizer = self._optimizer.make(params, self.config, self.backend.xp)
        step, lanes = self._at(k)
        times = []
        with epochs.blas_threads(lanes):
            for _ in range(steps + 1):  # the first call may compile or warm caches: not counted
                start = time.perf_counter()
                _, _, grads, _ = step.gradients(params, X_nd, k, lanes)
                step.update(optimizer, params, grads, self.config.lr)
                self.backend.synchronize()
                times.append(time.perf_counter() - start)
        return float(np.median(times[1:]))

    def _dead_fraction(self, kept_count_h) -> float:
        """The fraction of hidden units no example kept in the epoch (the MPI trainers count theirs over the ranks)."""
        return float(to_host((kept_count_h == 0).mean()))

    def code_l0(self, X_nd, k: int, chunk: int = 1024) -> float | None:
        """Mean count of non-zero code units per row of ``X_nd`` at ``k``: k for linear units (the top-k
        keeps k, and is not run again for it); with relu units, the kept ones above 0, counted here."""
        if self.config.activation == "linear":
            return float(k)
        nonzero = 0
        with epochs.blas_threads(1):
            for start in range(0, X_nd.shape[0], chunk):
                Z_nh = model.hidden_preactivations(self.params, X_nd[start:start + chunk])
                _, val_nk = model.select_units(Z_nh, k, self.config.topk, self.config.activation)
                nonzero += int(to_host(self.backend.xp.count_nonzero(val_nk)))
        return nonzero / X_nd.shape[0]

    def evaluate_loss(self, X_nd, k: int | None = None, chunk: int = 1024) -> float:
        """Mean of 0.5 ||x - xhat||^2 per example over ``X_nd``, with ``k`` kept units.

        ``chunk`` rows at a time: the ``(chunk, H)`` code is the one temporary (4 MB at H = 1000)."""
        k = self.config.k if k is None else k
        lanes = self._evaluation.lanes()  # on the CPU kernels, the sparse decoder in lanes (steps.resolve_evaluation)
        sparse_X = self._inputs.of(X_nd, self.dtype, "evaluation") if self._evaluation.in_lanes else None
        total = 0.0
        with epochs.blas_threads(lanes):
            for start in range(0, X_nd.shape[0], chunk):
                stop = min(start + chunk, X_nd.shape[0])
                X_rows = None if sparse_X is None else sparse_X.rows(np.arange(start, stop))
                total += 0.5 * self._evaluation.squared_error(self.params, X_nd[start:start + chunk], k, lanes, X_rows)
        return total / X_nd.shape[0]

    def checkpoint(self, preprocess: dict | None = None) -> Checkpoint:
        """A host copy of the whole state (what resuming needs)."""
        if self._capture is not None:
            self._capture.before_checkpoint(self)
        return Checkpoint(
            params={name: to_host(value) for name, value in self.params.items()},
            velocities={name: to_host(value) for name, value in self.optimizer.velocities.items()},
            config=self.config.to_dict(), epoch=self.epoch, step=self.step,
            batch_in_epoch=self.batch_in_epoch, rng_state=self.rng.bit_generator.state,
            epoch_perm=self.epoch_perm if self.batch_in_epoch else None,
            preprocess=dict(preprocess or {}),
            epoch_tally=epochs.tally_state(self),
            units={"since_kept_h": to_host(self.since_kept_h)},
        )
