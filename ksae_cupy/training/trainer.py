"""The training loop: shuffled minibatches, the sparsity schedule, momentum SGD, checkpoints.

:class:`~ksae_cupy.training.config.TrainConfig` (in config.py, re-exported here) holds every option
that shapes a run (it is saved in checkpoints); :class:`Trainer` owns the parameters, velocities
and random state on one backend and runs epochs. It never prints: it reports each epoch to a callback, so the CLI and the Python
API decide what to show and where to write.

Determinism: the initial weights and each epoch's order come from one NumPy generator on
the host, so a CPU run and a GPU run with one seed see the same batches, and a resumed run
continues the very same sequence (the generator's state, and mid-epoch the epoch's order,
are saved in the checkpoint).

Over 400 lines: the one trainer every run kind builds on (the distributed and baseline trainers subclass it),
with the state a bit-identical resume needs (parameters, velocities, random state, the epoch's place and
tally) kept beside the step that changes it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from ksae_cupy import model
from ksae_cupy.metrics import total_variance
from ksae_cupy.backend import Backend, to_host
from ksae_cupy.cpu.sparse_encoder import RunInputs
from ksae_cupy.gpu.graph_epoch import EpochGraph
from ksae_cupy.gpu.graph_step import CapturedEpochs, graph_step_applies
from ksae_cupy.training import epochs
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
    # With the epoch graph: whether a fresh epoch's order is drawn on the device, in the graph (NumPy's permutation,
    # bit for bit, ksae_cupy.gpu.shuffle), else on the host and copied in.
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
        self._spread = None  # fit's sum ||x - mean||^2 of its rows, by split (the FVE's denominators)
        self._batch_nonzero = None  # the last batch's count of non-zero code units (relu units)
        self._captured_from = None  # where the running captured epoch began (_CapturedStart)
        self.stop_requested = False  # set (e.g. by a SIGINT handler) to stop after the current step
        # The functions each batch calls, chosen once here (ksae_cupy.training.steps); an epoch picks
        # the step of its k, and reads the lanes it runs in when it starts.
        self._steps = resolve_steps(config, xp, W_in_rows=bool(self.params["W_dh"].flags.f_contiguous),
                                    sparse=self.takes_sparse_step, optimizer=self._optimizer)
        self._evaluation = resolve_evaluation(config, xp)
        # The inputs' CSR form, built once per set, where they are sparse enough for the encoder to run
        # from their non-zeros (ksae_cupy.cpu.sparse_encoder); else BLAS's X W. _batch_rows: the batch's rows in it.
        self._inputs = RunInputs(applies=xp is np and self.takes_sparse_step)
        self._batch_rows = None
        self._epoch_step = None  # (k, Step, lanes) of the epoch running
        self._captured = self._captured_epochs(xp, config) if self._captures else None

    def _captured_epochs(self, xp, config):
        """The captured GPU path: each epoch one CUDA graph (graph_epoch), or the step graphs (graph_step)."""
        if self.gpu_epoch_graph:
            return EpochGraph(xp, self.params, self.optimizer.velocities, self.since_kept_h, config,
                              order_on_device=self.gpu_order_on_device)
        return CapturedEpochs(xp, self.params, self.optimizer.velocities, self.since_kept_h, config)

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
        self._captures, self._captured = False, None

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
        every batch. A stop requested mid-epoch returns at once (:meth:`run_epoch`); one requested
        during the last batch of an epoch, after that epoch's report and checkpoint.
        """
        def after_epoch(report):
            if checkpoint is not None and should_checkpoint is not None and should_checkpoint(report.epoch):
                checkpoint()

        with self.backend.use():
            # The data's spread, once for the run (a pass over the rows): the FVE's denominators.
            self._spread = {"train": total_variance(X_train_nd),
                            "valid": None if X_valid_nd is None else total_variance(X_valid_nd)}
            try:
                return epochs.run_epochs(self, lambda: self.run_epoch(X_train_nd, X_valid_nd, on_batch), on_epoch,
                                         after_epoch)
            finally:
                self._spread = None

    def run_epoch(self, X_train_nd, X_valid_nd=None, on_batch=None) -> EpochReport | None:
        """Train one epoch (or the rest of an interrupted one) on device arrays.

        ``on_batch(done, total)`` is called after every batch (for a progress bar).
        Returns the epoch's report, or None when :attr:`stop_requested` stopped it midway
        (then :attr:`batch_in_epoch` and :attr:`epoch_perm` say where it stands).
        The distributed trainers reuse this loop and override only :meth:`_batch_gradients`
        (where they communicate) and :meth:`_dead_fraction`.

        NumPy's overflow and invalid-value warnings are off here: a diverging run would print
        pages of them before its one line, and every one of them is caught anyway, since a
        non-finite loss or parameter stops the run as diverged (:class:`TrainingDiverged`).
        """
        self._epoch_step = self._step_and_lanes(self.current_k())
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"), self._blas_for(self._epoch_step[2]):
                return self._run_epoch(X_train_nd, X_valid_nd, on_batch)
        finally:
            self._epoch_step = None

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

    def _blas_beside_lanes(self, k: int):
        """BLAS on one thread while lanes run (each lane computes its own rows of ``X W``); else nothing."""
        return self._blas_for(self._at(k)[1])

    @staticmethod
    def _blas_for(lanes: int):
        if lanes == 1:
            return contextlib.nullcontext()
        from threadpoolctl import threadpool_limits
        return threadpool_limits(limits=1, user_api="blas")

    def _run_epoch(self, X_train_nd, X_valid_nd, on_batch) -> EpochReport | None:
        epoch = self.open_epoch(X_train_nd)
        if self._captured is not None and self._captured.runs_whole_epochs:
            self._run_whole_epoch(epoch, X_train_nd, on_batch)
        elif not epochs.run_steps(self, epoch.n_batches, epoch.one_step, on_batch):
            return None
        return self.close_epoch(epoch, X_train_nd, X_valid_nd)

    def _run_whole_epoch(self, epoch: "OpenEpoch", X_train_nd, on_batch) -> None:
        """The epoch's batches as one CUDA graph (:mod:`ksae_cupy.gpu.graph_epoch`): progress and a stop request
        act per epoch."""
        captured, cfg, n_batches = self._captured, self.config, epoch.n_batches
        t0 = time.perf_counter()
        captured.run_epoch(X_train_nd, epoch.order, epoch.first_batch, cfg.batch_size,
                           self.rng.bit_generator.state if epoch.device_order else None)
        epoch.parts["steps"] += time.perf_counter() - t0  # launch time: the GPU's own is in the epoch's total
        self._captured_from.before_last = captured.loss_before_last()
        if epoch.device_order:  # the order drawn (for a checkpoint before the epoch ends) and the generator after it
            self.epoch_perm, self.rng.bit_generator.state = captured.drawn_order()
        self.step += n_batches - epoch.first_batch
        self.batch_in_epoch = n_batches
        if on_batch is not None:
            on_batch(n_batches, n_batches)

    def open_epoch(self, X_train_nd) -> "OpenEpoch":
        """Begin the epoch (or the rest of an interrupted one) at the running epoch's k (:meth:`run_epoch` set
        it): its order drawn, its clock started. Its ``one_step(b)`` trains batch ``b``; :meth:`close_epoch`
        ends it. A pack of runs (:mod:`ksae_cupy.training.packed`) drives its members through these too."""
        cfg = self.config
        clock = time.perf_counter
        parts = dict.fromkeys(("shuffle", "batches", "steps", "updates", "validation"), 0.0)
        start = clock()
        N = X_train_nd.shape[0]
        k, step, _ = self._epoch_step
        captured = self._captured
        # A fresh epoch on the epoch graph that draws orders: drawn on the device (ksae_cupy.gpu.graph_epoch), from
        # the generator's state, which comes back with the order; else drawn here (or the checkpoint's, resumed).
        device_order = captured is not None and captured.runs_whole_epochs and captured.draws_orders \
            and self.epoch_perm is None
        if device_order:
            self.batch_in_epoch, self.tally = 0, epochs.EpochTally()  # as epochs.begin_epoch starts an epoch
            order = None
        else:
            order = self.backend.asarray(epochs.begin_epoch(self, N).astype(np.int64))
        n_batches = epochs.n_batches(N, cfg.batch_size)
        first_batch = self.batch_in_epoch
        if captured is not None:  # the whole step on the device; its loss and unit counts summed there
            self._captured_from = _CapturedStart(self.tally, first_batch, N, cfg.batch_size)
            captured.begin(X_train_nd, k, self.tally.get("loss", 0.0))
        # The set in CSR form for the sparse encoder: built on the run's first epoch (timed in its "shuffle" part).
        sparse_X = self._inputs.of(X_train_nd, self.dtype) if step.in_lanes else None
        parts["shuffle"] = clock() - start

        def one_step(b):
            t0 = clock()
            rows = order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            if captured is not None:
                if b == n_batches - 1:  # the loss before the last (maybe smaller) batch: one wait per epoch
                    self._captured_from.before_last = captured.loss_sum()
                captured.run(X_train_nd, rows)
                parts["steps"] += clock() - t0  # launch time: the GPU's own is in the epoch's total
            else:
                self._batch_rows = None if sparse_X is None else sparse_X.rows(rows)
                try:
                    self._take_step(X_train_nd[rows], k, step, parts, t0)  # a copy of the rows
                finally:
                    self._batch_rows = None

        return OpenEpoch(k=k, order=order, n_batches=n_batches, first_batch=first_batch, start=start, parts=parts,
                         one_step=one_step, device_order=device_order)

    def close_epoch(self, epoch: "OpenEpoch", X_train_nd, X_valid_nd=None) -> EpochReport:
        """End the epoch :meth:`open_epoch` began, its every batch trained: the validation pass, the health
        check, the epoch counted; its report."""
        cfg, clock, k, parts = self.config, time.perf_counter, epoch.k, epoch.parts
        N, n_batches, first_batch, start = X_train_nd.shape[0], epoch.n_batches, epoch.first_batch, epoch.start
        if self._captured is not None:
            self._sync_captured(k)
        self.backend.synchronize()
        seconds = clock() - start
        samples = min(N, n_batches * cfg.batch_size) - first_batch * cfg.batch_size
        t0 = clock()
        valid_loss = self.evaluate_loss(X_valid_nd, k) if X_valid_nd is not None else None
        valid_l0 = self.code_l0(X_valid_nd, k) if X_valid_nd is not None else None
        parts["validation"] = clock() - t0
        tally = self.tally
        self._check_health(float(tally.get("loss", 0.0)), valid_loss)
        epochs.end_epoch(self)
        spread = self._spread or {"train": total_variance(X_train_nd),
                                  "valid": None if X_valid_nd is None else total_variance(X_valid_nd)}
        # Host numbers (a count may sit on the device); the same on every rank of a distributed trainer.
        sq_error, nonzero, examples = (epochs.host_number(tally.get(name, 0))
                                       for name in ("sq_error", "nonzero", "examples"))
        return EpochReport(
            epoch=self.epoch, step=self.step, k=k, lr=cfg.lr,
            train_loss=tally.mean("loss", "batches") or 0.0,
            valid_loss=valid_loss,
            dead_fraction=self._dead_fraction(tally.get("kept_h")),
            samples_per_s=samples / seconds if seconds > 0 else float("inf"),
            seconds=seconds,
            parts={name: round(value, 4) for name, value in parts.items()},
            dead_window_fraction=self.dead_window_fraction() if self.tracks_dead_units else None,
            aux_loss=(tally.mean("aux_loss", "aux_batches") or 0.0) if self.config.aux_k else None,
            fve=epochs.fraction_of_variance_explained(sq_error, spread["train"]),
            valid_fve=None if valid_loss is None else
            epochs.fraction_of_variance_explained(2.0 * valid_loss * X_valid_nd.shape[0], spread["valid"]),
            l0=None if nonzero is None or not examples else nonzero / examples,
            valid_l0=valid_l0,
        )

    def _take_step(self, X_nd, k: int, step, parts: dict, t0: float) -> float:
        """One step of the generic path on the batch ``X_nd``: gradients, update, the epoch's tally; its loss."""
        clock = time.perf_counter
        t1 = clock()
        cfg = self.config
        self._batch_nonzero = None
        loss, grads, kept_h = self._gradients(X_nd, k)
        if not math.isfinite(loss):
            raise TrainingDiverged(f"the loss became {loss} at epoch {self.epoch + 1}, step {self.step + 1} with "
                                   f"learning rate {cfg.lr}", loss, self.epoch + 1, self.step + 1, cfg.lr)
        t2 = clock()
        step.update(self.optimizer, self.params, grads, cfg.lr)
        parts["batches"] += t1 - t0
        parts["steps"] += t2 - t1
        parts["updates"] += clock() - t2  # on a GPU the parts are launch times until the epoch's synchronize
        self.count_step(loss, X_nd.shape[0], k, kept_h)
        return loss

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

    def _sync_captured(self, k: int) -> None:
        """The tally from the captured step's device counters (they count this session's batches; the
        tally held the batches before when the epoch began here)."""
        start, captured, cfg = self._captured_from, self._captured, self.config
        done = self.batch_in_epoch - start.first_batch  # this session's batches
        loss = captured.loss_sum()
        session_examples = min(start.N, self.batch_in_epoch * start.batch_size) - start.first_batch * start.batch_size
        full = loss if start.before_last is None else start.before_last  # the loss of full batches
        sq_error = 2.0 * start.batch_size * (full - start.values.get("loss", 0.0)) + \
            (0.0 if start.before_last is None else 2.0 * (session_examples - (done - 1) * start.batch_size)
             * (loss - start.before_last))
        values = dict(start.values)
        values.update(loss=loss, batches=start.values.get("batches", 0) + done,
                      sq_error=start.values.get("sq_error", 0.0) + sq_error,
                      examples=start.values.get("examples", 0) + session_examples,
                      kept_h=start.values.get("kept_h", 0) + captured.kept_count_h())
        # The captured step keeps no count of non-zero codes: linear units keep k, relu ones are not counted.
        values["nonzero"] = start.values.get("nonzero", 0) + session_examples * k if cfg.activation == "linear" \
            else None
        if cfg.aux_k:
            values.update(aux_loss=start.values.get("aux_loss", 0.0) + captured.aux_loss_sum(),
                          aux_batches=start.values.get("aux_batches", 0) + done)
        self.tally.values = values

    def _check_health(self, loss_sum: float, valid_loss: float | None) -> None:
        """Stop as diverged when the epoch's summed loss or the validation loss is not finite
        (each batch's loss was finite, but their sum or a whole split's error can overflow:
        e.g. unscaled integer data) or when the parameters hold NaN or infinities; raised
        before the epoch is counted, so nothing of it is logged or checkpointed."""
        where = f"at epoch {self.epoch + 1} (step {self.step})"
        hint = f"nothing was saved after the last good checkpoint; try a smaller {{name}} (now {self.config.lr}) or scaled data"
        if not math.isfinite(loss_sum):
            raise _Diverged(f"the training loss summed over the epoch became {loss_sum} {where}; {hint}")
        if valid_loss is not None and not math.isfinite(valid_loss):
            raise _Diverged(f"the validation loss became {valid_loss} {where}; {hint}")
        self.check_params_finite()

    def check_params_finite(self) -> None:
        """Raise :class:`TrainingDiverged` if a parameter holds NaN or infinities (a checkpoint
        of such a model must never replace a good one)."""
        for name, value in self.params.items():
            if not bool(self.backend.xp.isfinite(value).all()):
                raise _Diverged(f"{name} holds NaN or infinite values after step {self.step}; the run diverged "
                                f"and nothing was saved after the last good checkpoint; try a smaller {{name}} "
                                f"(now {self.config.lr}) or scaled data")

    def _batch_gradients(self, X_nd, k: int):
        """``(loss, grads, kept_h)`` for one minibatch: the loss, the gradients to step with,
        and how many examples kept each hidden unit. The one hook where subclasses communicate."""
        step, lanes = self._at(k)
        # On the CPU kernels the sparse step may hand W's gradient over in parts, for step.update to apply.
        loss, grads, cache = step.loss_and_grads(self.params, X_nd, k, lanes, self._batch_rows)
        kept_h = self.backend.xp.bincount(cache.idx_nk.ravel(), minlength=self.config.hidden)
        self._batch_nonzero = self._code_nonzero(cache)
        return loss, grads, kept_h

    def _gradients(self, X_nd, k: int):
        """``(loss, grads, kept_h)``: :meth:`_batch_gradients` (the paper's step), or with ``aux_k`` the
        AuxK step (beyond the paper, :mod:`ksae_cupy.auxk_step`), its auxiliary loss added to the epoch's."""
        if not self.config.aux_k:
            return self._batch_gradients(X_nd, k)
        if not self.tracks_dead_units:
            raise KsaeError(f"aux_k {self.config.aux_k}: the auxiliary loss is not available in the distributed "
                            f"trainers yet; train with one process, or without it")
        loss, aux_loss, grads, kept_h = self.auxk_batch_gradients(X_nd, k)
        self.tally.add("aux_loss", aux_loss)
        self.tally.add("aux_batches", 1)
        return loss, grads, kept_h

    def auxk_batch_gradients(self, X_nd, k: int, params=None):
        """``(loss, aux_loss, grads, kept_h)`` of one minibatch with the auxiliary loss on the units dead now."""
        step, lanes = self._at(k)
        loss, aux_loss, grads, cache = step.loss_and_grads_auxk(self.params if params is None else params, X_nd, k,
                                                                self.dead_h(), lanes)
        kept_h = self.backend.xp.bincount(cache.idx_nk.ravel(), minlength=self.config.hidden)
        self._batch_nonzero = self._code_nonzero(cache)
        return loss, aux_loss, grads, kept_h

    def _code_nonzero(self, cache):
        """The batch's non-zero code units, counted only for relu units (a unit kept at 0); linear units keep
        n * k, which the tally adds without a count on the step's path."""
        return None if self.config.activation == "linear" else epochs.code_nonzero(cache)

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
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"), self._blas_for(lanes):
            loss, grads, _ = self._batch_gradients(X_nd, k)
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
        with self._blas_for(lanes):
            for _ in range(steps + 1):  # the first call may compile or warm caches: not counted
                start = time.perf_counter()
                _, grads, _ = step.loss_and_grads(params, X_nd, k, lanes)
                step.update(optimizer, params, grads, self.config.lr)
                self.backend.synchronize()
                times.append(time.perf_counter() - start)
        return float(np.median(times[1:]))

    def _dead_fraction(self, kept_count_h) -> float:
        """The fraction of hidden units that no example kept during the epoch."""
        return float(to_host((kept_count_h == 0).mean()))

    def code_l0(self, X_nd, k: int, chunk: int = 1024) -> float | None:
        """Mean count of non-zero code units per row of ``X_nd`` at ``k``: k for linear units (the top-k
        keeps k, and is not run again for it); with relu units, the kept ones above 0, counted here."""
        if self.config.activation == "linear":
            return float(k)
        nonzero = 0
        with self._blas_for(1):
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
        with self._blas_for(lanes):
            for start in range(0, X_nd.shape[0], chunk):
                stop = min(start + chunk, X_nd.shape[0])
                X_rows = None if sparse_X is None else sparse_X.rows(np.arange(start, stop))
                total += 0.5 * self._evaluation.squared_error(self.params, X_nd[start:start + chunk], k, lanes, X_rows)
        return total / X_nd.shape[0]

    def checkpoint(self, preprocess: dict | None = None) -> Checkpoint:
        """A host copy of the whole state (what resuming needs)."""
        if self._captured is not None:
            # The captured steps run on a stream of their own: wait for them (the copies below run on the
            # default stream); mid-epoch, the epoch's counters so far are on the device.
            self._captured.loss_sum()
            if self.batch_in_epoch and getattr(self, "_captured_from", None) is not None:
                self._sync_captured(self.current_k())
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


@dataclass
class OpenEpoch:
    """An epoch :meth:`Trainer.open_epoch` began: its k, order, batches, the batch it began at, its clock
    and parts so far, and ``one_step(b)``, which trains batch ``b`` of it."""

    k: int
    order: object
    n_batches: int
    first_batch: int
    start: float
    parts: dict
    one_step: object
    device_order: bool = False  # the epoch graph draws this epoch's order on the device (``order`` is None)


class _CapturedStart:
    """Where a captured epoch began in this session: the tally then, the batch, the rows and batch size;
    ``before_last``, the device's loss sum read before the epoch's last batch (which may be smaller)."""

    def __init__(self, tally, first_batch: int, N: int, batch_size: int):
        self.values, self.first_batch, self.N, self.batch_size = dict(tally.values), first_batch, N, batch_size
        self.before_last = None
