"""The training loop: shuffled minibatches, the sparsity schedule, momentum SGD, checkpoints.

:class:`TrainConfig` holds every option that shapes a run (it is saved in checkpoints);
:class:`Trainer` owns the parameters, velocities and random state on one backend and runs
epochs. It never prints: it reports each epoch to a callback, so the CLI and the Python
API decide what to show and where to write.

Determinism: the initial weights and each epoch's order come from one NumPy generator on
the host, so a CPU run and a GPU run with one seed see the same batches, and a resumed run
continues the very same sequence (the generator's state, and mid-epoch the epoch's order,
are saved in the checkpoint).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from ksae_cupy import model
from ksae_cupy.backend import Backend, to_host
from ksae_cupy.gpu.graph_step import CapturedEpochs, graph_step_applies
from ksae_cupy.training.checkpoint import Checkpoint
from ksae_cupy.errors import KsaeError, OptionError, TrainingDiverged, literal, note, python_name  # TrainingDiverged is re-exported here
from ksae_cupy.training.options import (DictConfig, ValidatedOnce, check_batch_size, check_dtype, check_in_dtype,
                                        check_momentum, check_positive_count, check_positive_finite)
from ksae_cupy.optim import MomentumSGD
from ksae_cupy.schedules import sparsity_at_epoch
from ksae_cupy.sparse_step import choose_step, sparse_layout
from ksae_cupy.topk import TOPK_METHODS
from ksae_cupy.training.steps import resolve_evaluation, resolve_steps, step_kind


def _template(message: str) -> str:
    """A shared check's message, made with ``{name}`` for the field, as an OptionError template (its braces kept)."""
    return literal(message).replace("{{name}}", "{name}")


def _option_error(field: str, template: str) -> KsaeError:
    """An :class:`OptionError` for ``field``; for a caller that still spells fields as flags (``--hidden``),
    the message with that spelling (a plain KsaeError, which the CLI prints as it reads)."""
    if field.startswith("-"):
        return KsaeError(template.format(name=field))
    return OptionError(field, template)


class _Diverged(TrainingDiverged, OptionError):
    """A divergence whose advice names the rate: ``lr`` in Python, ``--lr`` on a command line."""

    def __init__(self, template: str):
        OptionError.__init__(self, "lr", template)
        self.loss = self.epoch = self.step = self.lr = None


@dataclass
class TrainConfig(DictConfig, ValidatedOnce):
    """Options of one training run; defaults are the paper's unsupervised MNIST settings.

    Sources: sigma, momentum, lr and epochs from section 4.3.2; the k schedule (k_start
    100, linear over the first half of the epochs) from section 4.3.1; batch 128 from the
    authors' code.
    """

    hidden: int = 1000
    k: int = 25
    k_start: int | None = 100  # None: no schedule, k from the first epoch
    epochs: int = 5000
    batch_size: int = 128
    lr: float = 0.01
    momentum: float = 0.9
    sigma: float = 0.01
    topk: str = "sort"
    seed: int = 0
    dtype: str = "float32"
    activation: str = "linear"  # the paper's linear units; "relu" is an investigated variant
    # Epochs the k schedule spans (None: all of them). Set when a resumed run changes its
    # epochs, so that k goes on as it was scheduled instead of jumping back up.
    k_schedule_epochs: int | None = None
    # dense, sparse or auto (by k / H): the same math, so a checkpoint without it loads as auto.
    step: str = "auto"
    # Whether lr was derived from the data (lr "auto", see learning_rate.py); lr holds the rate.
    lr_auto: bool = False
    # Beyond the paper (issue 35), all off by default. aux_k > 0: the auxiliary loss of Gao et al.
    # (2024) on the dead units (model.loss_and_grads_auxk), weighted by aux_coef (1/32, as theirs).
    # A unit is dead when no example of the last dead_window examples kept it (also what the
    # dead_window_fraction metric counts, whatever aux_k). center_input: the training mean is
    # subtracted from every input (the estimator does it, and keeps the mean with the model).
    aux_k: int = 0
    aux_coef: float = 1 / 32
    dead_window: int = 10000
    center_input: bool = False

    def validate(self, n_train: int | None = None, name=python_name) -> None:
        """Raise :class:`~ksae_cupy.errors.OptionError` naming the first bad field and what is allowed.

        Messages name fields as Python does (``k_start``); a command line prints its flag instead
        (the CLI spells an OptionError's field). ``name(field)`` renames a field for a front end with
        its own parameter names (the estimator's ``n_hidden``). ``lr`` may still be ``"auto"`` here;
        a :class:`Trainer` needs the rate itself.
        """
        def bad(field, template):
            return _option_error(name(field), template)

        def checked(field, check, *args):  # a shared check of training/options.py, its message in {name} terms
            try:
                check("{name}", *args)
            except KsaeError as exc:
                raise bad(field, _template(str(exc))) from None

        # The other field a message names, in words ("1 <= k <= hidden"; n_hidden from the estimator), flag or not.
        hidden = name("hidden").lstrip("-")
        checked("hidden", check_positive_count, self.hidden, "hidden units")
        if not 1 <= self.k <= self.hidden:
            raise bad("k", f"{{name}} {self.k} is not allowed; use 1 <= k <= {hidden} ({self.hidden})")
        if self.k_start is not None and self.k_start < self.k:
            raise bad("k_start", f"{{name}} {self.k_start} is not allowed; use {{name}} >= k ({self.k})")
        if self.k_start is not None and self.k_start > self.hidden:
            raise bad("k_start", f"{{name}} {self.k_start} is not allowed; use {{name}} <= {hidden} ({self.hidden})")
        checked("epochs", check_positive_count, self.epochs, "epochs")
        checked("batch_size", check_batch_size, self.batch_size, n_train)
        if self.lr != "auto":
            if isinstance(self.lr, str):
                raise bad("lr", f"{{name}} {literal(repr(self.lr))} is not allowed; use a positive learning rate "
                                f"or 'auto'")
            checked("lr", check_positive_finite, self.lr, "learning rate (or 'auto')")
        checked("momentum", check_momentum, self.momentum)
        checked("sigma", check_positive_finite, self.sigma, "standard deviation")
        if self.topk not in TOPK_METHODS:
            raise bad("topk", f"{{name}} {literal(repr(self.topk))} is not allowed; use one of "
                              f"{', '.join(TOPK_METHODS)}")
        if self.activation not in model.ACTIVATIONS:
            raise bad("activation", f"{{name}} {literal(repr(self.activation))} is not allowed; use one of "
                                    f"{', '.join(model.ACTIVATIONS)}")
        checked("dtype", check_dtype, self.dtype)
        # (lr is checked against the data: learning_rate.check_rate_moves_weights)
        checked("sigma", lambda field, value: check_in_dtype(self.dtype, **{field: ("sigma", value)}), self.sigma)
        checked("momentum", lambda field, value: check_in_dtype(self.dtype, **{field: ("momentum", value)}),
                self.momentum)
        try:
            choose_step(self.step, self.k, self.hidden)
        except OptionError as exc:
            raise bad("step", exc.template) from None
        if isinstance(self.aux_k, bool) or not isinstance(self.aux_k, (int, np.integer)) or not 0 <= self.aux_k <= self.hidden:
            raise bad("aux_k", f"{{name}} {literal(self.aux_k)} is not allowed; use 0 (off) to {hidden} "
                               f"({self.hidden}) dead units per example")
        if self.aux_k:
            checked("aux_coef", check_positive_finite, self.aux_coef, "weight of the auxiliary loss")
        checked("dead_window", check_positive_count, self.dead_window, "examples")

    def check_new(self, name=lambda field: field, refuse: bool = True) -> None:
        """A value with no effect in a new run (a loaded checkpoint keeps what it recorded), which
        config.json would record as if it had acted: refused (a command), or with ``refuse=False`` said
        in a note (the estimator, which a grid search may give aux_coef beside aux_k=0)."""
        if not self.aux_k and self.aux_coef != TrainConfig.aux_coef:
            error = _option_error(name("aux_coef"), f"{{name}} {self.aux_coef} has no effect with {name('aux_k')} 0 "
                                                    f"(the auxiliary loss is off); give {name('aux_k')} N too, or "
                                                    f"leave {{name}} out")
            if refuse:
                raise error
            note(str(error))

    def resolve_lr(self, lr: float) -> None:
        """``lr="auto"`` resolved to the rate derived from the data (``lr_auto`` records it). A validated
        configuration stays validated: the rate is positive and finite, all :meth:`validate` asks of one."""
        if isinstance(lr, bool) or not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"a learning rate derived from the data must be positive and finite, not {lr!r}")
        self.changed_validly(lr=lr, lr_auto=True)

    def drop_schedule(self) -> None:
        """Train with ``k`` from the first epoch (``k_start`` None, which :meth:`validate` allows with any
        other values): a validated configuration stays validated."""
        self.changed_validly(k_start=None)


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
    # With aux_k: the mean auxiliary loss of the epoch's batches (after a resume mid-epoch, of those since).
    aux_loss: float | None = None


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

    def __init__(self, config: TrainConfig, backend: Backend, D: int, checkpoint: Checkpoint | None = None):
        config.check()  # validated here unless the caller already did (a command validates its options once)
        if config.lr == "auto":  # a programming error, not the user's: the callers resolve it
            raise ValueError("TrainConfig.lr 'auto' must be resolved from the data before training")
        self.config = config
        self.backend = backend
        self.dtype = np.dtype(config.dtype)
        xp = backend.xp
        # On a GPU, the paper's step is captured once as a CUDA graph and replayed per batch.
        self._captures = backend.is_gpu and self.captures_gpu_step and graph_step_applies(config)
        if checkpoint is None:
            self.rng = np.random.default_rng(config.seed)
            host_params = model.init_params(D, config.hidden, config.sigma, self.rng, self.dtype)
            self.params = self._resident(host_params)
            self.optimizer = MomentumSGD(self.params, config.momentum, xp)
            self.epoch, self.step, self.batch_in_epoch, self.epoch_perm = 0, 0, 0, None
            since_kept_h = np.zeros(config.hidden, dtype=np.int64)
        else:
            self.rng = np.random.default_rng()
            self.rng.bit_generator.state = checkpoint.rng_state
            self.params = self._resident(checkpoint.params)
            self.optimizer = MomentumSGD(self.params, config.momentum, xp)
            for name, value in checkpoint.velocities.items():
                self.optimizer.velocities[name][...] = backend.asarray(value)
            self.epoch, self.step = checkpoint.epoch, checkpoint.step
            self.batch_in_epoch, self.epoch_perm = checkpoint.batch_in_epoch, checkpoint.epoch_perm
            # Checkpoints from before the dead-unit state: as at the start of a run.
            since_kept_h = checkpoint.units.get("since_kept_h", np.zeros(config.hidden, dtype=np.int64))
        # Per hidden unit: examples trained on since an example last kept it (dead at dead_window).
        self.since_kept_h = backend.asarray(np.asarray(since_kept_h, dtype=np.int64))
        self._aux_loss_sum, self._aux_batches = 0.0, 0  # with aux_k: this session's batches of the epoch
        # The unfinished epoch's loss so far (a mid-epoch checkpoint's): its report then covers every batch.
        resumed_mid_epoch = checkpoint is not None and checkpoint.batch_in_epoch
        self.epoch_loss_sum = checkpoint.epoch_loss_sum if resumed_mid_epoch else 0.0
        self.epoch_loss_batches = checkpoint.epoch_loss_batches if resumed_mid_epoch else 0
        self.stop_requested = False  # set (e.g. by a SIGINT handler) to stop after the current step
        # The functions each batch calls, chosen once here (ksae_cupy.training.steps); an epoch picks
        # the step of its k, and reads the lanes it runs in when it starts.
        self._steps = resolve_steps(config, xp, W_in_rows=bool(self.params["W_dh"].flags.f_contiguous),
                                    sparse=self.takes_sparse_step)
        self._evaluation = resolve_evaluation(config, xp)
        self._epoch_step = None  # (k, Step, lanes) of the epoch running
        self._captured = CapturedEpochs(xp, self.params, self.optimizer.velocities, self.since_kept_h, config) \
            if self._captures else None

    def _resident(self, host_params):
        """The parameters on the backend; ``W_dh`` in the memory order of the step at the target k
        (the sparse step wants Fortran order; see :func:`ksae_cupy.sparse_step.sparse_layout`)."""
        params = {name: self.backend.asarray(value) for name, value in host_params.items()}
        if self.takes_sparse_step and not self._captures \
                and choose_step(self.config.step, self.config.k, self.config.hidden) == "sparse":
            params["W_dh"] = sparse_layout(params["W_dh"])
        return params

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
        last = None
        with self.backend.use():
            while not self.finished:
                report = self.run_epoch(X_train_nd, X_valid_nd, on_batch)
                if report is None:  # stopped mid-epoch
                    break
                last = report
                if on_epoch is not None:
                    on_epoch(report)
                if checkpoint is not None and should_checkpoint is not None and should_checkpoint(report.epoch):
                    checkpoint()
                if self.stop_requested:
                    break
        return last

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
        cfg, xp = self.config, self.backend.xp
        clock = time.perf_counter
        parts = dict.fromkeys(("shuffle", "batches", "steps", "updates", "validation"), 0.0)
        start = clock()
        N = X_train_nd.shape[0]
        k, step, _ = self._epoch_step
        if self.epoch_perm is None:
            self.epoch_perm = self.rng.permutation(N)  # on every rank the same generator state
            self.batch_in_epoch = 0
        order = self.backend.asarray(self.epoch_perm.astype(np.int64))
        n_batches = -(-N // cfg.batch_size)  # the last, smaller batch is trained on too
        # One count per hidden unit held here (all of them, or this rank's block).
        kept_count_h = xp.zeros(self.params["b_h"].shape[0], dtype=np.int64)
        # Resumed mid-epoch: the batches before the interruption count too (their sum was checkpointed).
        loss_sum, loss_batches = (self.epoch_loss_sum, self.epoch_loss_batches) if self.batch_in_epoch else (0.0, 0)
        self._aux_loss_sum, self._aux_batches = 0.0, 0  # with aux_k: this session's batches of the epoch
        first_batch = self.batch_in_epoch
        captured = self._captured
        if captured is not None:  # the whole step on the device; its loss and unit counts summed there
            captured.begin(X_train_nd, k, loss_sum)
        parts["shuffle"] = clock() - start
        for b in range(first_batch, n_batches):
            t0 = clock()
            rows = order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            if captured is not None:
                captured.run(X_train_nd, rows)
                parts["steps"] += clock() - t0  # launch time: the GPU's own is in the epoch's total
            else:
                loss = self._take_step(X_train_nd[rows], k, step, kept_count_h, parts, t0)  # a copy of the rows
                loss_sum += loss
                self.epoch_loss_sum = loss_sum
            loss_batches += 1
            self.epoch_loss_batches = loss_batches
            self.step += 1
            self.batch_in_epoch = b + 1
            if on_batch is not None:
                on_batch(b + 1, n_batches)
            if self.stop_requested and b + 1 < n_batches:
                if captured is not None:
                    self.epoch_loss_sum = captured.loss_sum()
                return None
        if captured is not None:
            loss_sum, kept_count_h = captured.loss_sum(), captured.kept_count_h()
            if cfg.aux_k:
                self._aux_loss_sum, self._aux_batches = captured.aux_loss_sum(), n_batches - first_batch
        self.backend.synchronize()
        seconds = clock() - start
        samples = min(N, n_batches * cfg.batch_size) - first_batch * cfg.batch_size
        t0 = clock()
        valid_loss = self.evaluate_loss(X_valid_nd, k) if X_valid_nd is not None else None
        parts["validation"] = clock() - t0
        self._check_health(loss_sum, valid_loss)
        self.epoch += 1
        self.batch_in_epoch, self.epoch_perm = 0, None
        self.epoch_loss_sum, self.epoch_loss_batches = 0.0, 0
        return EpochReport(
            epoch=self.epoch, step=self.step, k=k, lr=cfg.lr,
            train_loss=loss_sum / max(loss_batches, 1),
            valid_loss=valid_loss,
            # Resumed mid-epoch, units kept before the interruption are not counted here.
            dead_fraction=self._dead_fraction(kept_count_h),
            samples_per_s=samples / seconds if seconds > 0 else float("inf"),
            seconds=seconds,
            parts={name: round(value, 4) for name, value in parts.items()},
            dead_window_fraction=self.dead_window_fraction() if self.tracks_dead_units else None,
            aux_loss=self._aux_loss_sum / max(self._aux_batches, 1) if self.config.aux_k else None,
        )

    def _take_step(self, X_nd, k: int, step, kept_count_h, parts: dict, t0: float) -> float:
        """One step of the generic path on the batch ``X_nd``: gradients, update, unit counts; its loss."""
        clock = time.perf_counter
        t1 = clock()
        cfg = self.config
        loss, grads, kept_h = self._gradients(X_nd, k)
        if not math.isfinite(loss):
            raise TrainingDiverged(f"the loss became {loss} at epoch {self.epoch + 1}, step {self.step + 1} with "
                                   f"learning rate {cfg.lr}", loss, self.epoch + 1, self.step + 1, cfg.lr)
        t2 = clock()
        step.update(self.optimizer, self.params, grads, cfg.lr)
        parts["batches"] += t1 - t0
        parts["steps"] += t2 - t1
        parts["updates"] += clock() - t2  # on a GPU the parts are launch times until the epoch's synchronize
        kept_count_h += kept_h
        self._note_kept(kept_h, X_nd.shape[0])
        return loss

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
        loss, grads, cache = step.loss_and_grads(self.params, X_nd, k, lanes)
        kept_h = self.backend.xp.bincount(cache.idx_nk.ravel(), minlength=self.config.hidden)
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
        self._aux_loss_sum += aux_loss
        self._aux_batches += 1
        return loss, grads, kept_h

    def auxk_batch_gradients(self, X_nd, k: int, params=None):
        """``(loss, aux_loss, grads, kept_h)`` of one minibatch with the auxiliary loss on the units dead now."""
        step, lanes = self._at(k)
        loss, aux_loss, grads, cache = step.loss_and_grads_auxk(self.params if params is None else params, X_nd, k,
                                                                self.dead_h(), lanes)
        kept_h = self.backend.xp.bincount(cache.idx_nk.ravel(), minlength=self.config.hidden)
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
        optimizer = MomentumSGD(params, self.config.momentum, self.backend.xp)
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

    def evaluate_loss(self, X_nd, k: int | None = None, chunk: int = 1024) -> float:
        """Mean of 0.5 ||x - xhat||^2 per example over ``X_nd``, with ``k`` kept units.

        ``chunk`` rows at a time: the ``(chunk, H)`` code is the one temporary (4 MB at H = 1000)."""
        k = self.config.k if k is None else k
        lanes = self._evaluation.lanes()  # on the CPU kernels, the sparse decoder in lanes (steps.resolve_evaluation)
        total = 0.0
        with self._blas_for(lanes):
            for start in range(0, X_nd.shape[0], chunk):
                total += 0.5 * self._evaluation.squared_error(self.params, X_nd[start:start + chunk], k, lanes)
        return total / X_nd.shape[0]

    def checkpoint(self, preprocess: dict | None = None) -> Checkpoint:
        """A host copy of the whole state (what resuming needs)."""
        if self._captured is not None:
            # The captured steps run on a stream of their own: wait for them (the copies below run on the
            # default stream); mid-epoch, the loss summed so far is on the device.
            loss_so_far = self._captured.loss_sum()
            if self.batch_in_epoch:
                self.epoch_loss_sum = loss_so_far
        return Checkpoint(
            params={name: to_host(value) for name, value in self.params.items()},
            velocities={name: to_host(value) for name, value in self.optimizer.velocities.items()},
            config=self.config.to_dict(), epoch=self.epoch, step=self.step,
            batch_in_epoch=self.batch_in_epoch, rng_state=self.rng.bit_generator.state,
            epoch_perm=self.epoch_perm if self.batch_in_epoch else None,
            preprocess=dict(preprocess or {}),
            epoch_loss_sum=self.epoch_loss_sum if self.batch_in_epoch else 0.0,
            epoch_loss_batches=self.epoch_loss_batches if self.batch_in_epoch else 0,
            units={"since_kept_h": to_host(self.since_kept_h)},
        )
