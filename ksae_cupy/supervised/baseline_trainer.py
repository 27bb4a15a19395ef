"""The training loop of the baseline learners, resumable: state, epochs, checkpoints.

:class:`BaselineTrainer` owns one baseline's parameters, momentum velocities and random state
on one backend (as :class:`ksae_cupy.training.trainer.Trainer` does for the k-sparse
autoencoder) and runs epochs of :mod:`ksae_cupy.supervised.baselines`' steps. It never prints:
each epoch goes to a callback. ``baseline_fit.fit_autoencoder``, ``fit_rbm`` and ``ksae-baseline`` all train
through it.

Determinism: one host NumPy generator draws the initial weights, each epoch's order and every
batch's dropout masks or CD-1 uniforms, in that order. A checkpoint holds the generator's state
and, mid-epoch, the epoch's order, so a resumed run draws the very same numbers and ends bit
for bit where an uninterrupted one would (on one thread count: BLAS sums differ between counts).

Checkpoints have the k-sparse layout of :mod:`ksae_cupy.training.checkpoint` (``W_dh``, ``b_h``,
``c_d``, velocities, rng) under their own format name, ``ksae-cupy baseline checkpoint``: a
command made for k-sparse checkpoints refuses one by name instead of reading sigmoid weights as
a k-sparse model. Their ``config`` is the learner's options with ``model`` (a key of
:data:`~ksae_cupy.supervised.baselines.REGULARISATION`, or ``autoencoder`` for other rates).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ksae_cupy.backend import Backend, to_host
from ksae_cupy.cpu import numba_kernels as cpu_kernels
from ksae_cupy.errors import OptionError, TrainingDiverged, literal
from ksae_cupy.optimizers import OPTIMIZERS, PAPER as MOMENTUM
from ksae_cupy.supervised import baselines
from ksae_cupy.supervised.units import dropout_mask
from ksae_cupy.training import epochs
from ksae_cupy.training.checkpoint import Checkpoint, load_checkpoint, save_checkpoint


KIND = "ksae-baseline"  # the run folders' kind (session/runs.py): other commands refuse them by name

FORMAT = "ksae-cupy baseline checkpoint"


@dataclass
class BaselineReport:
    """What one epoch of a baseline learner did (one line of ``metrics.jsonl``)."""

    epoch: int  # 1-based
    step: int
    train_loss: float  # mean over the epoch's batches (AE: the dropout loss; RBM: reconstruction error)
    seconds: float  # the epoch's batches, without the validation pass
    valid_loss: float | None = None  # clean reconstruction error of the validation rows (RBM: mean-field)


def model_name(config) -> str:
    """The ``model`` a config trains: ``rbm``, the baseline whose dropout rates it has, or ``autoencoder``."""
    for name, baseline in baselines.BASELINES.items():
        if baseline.matches(config):
            return name
    return "autoencoder"


def config_for(model: str, **options):
    """The config of baseline ``model`` with its paper dropout and ``options`` (None: the class default)."""
    if model not in baselines.BASELINES:
        raise OptionError("model", f"{{name}} {literal(repr(model))} is not allowed; use one of "
                                   f"{', '.join(baselines.BASELINES)}")
    given = {key: value for key, value in options.items() if value is not None}
    baseline = baselines.BASELINES[model]
    return baseline.config(**given, **baseline.regularisation)


def config_to_dict(config) -> dict:
    return {"model": model_name(config), **config.to_dict()}


def config_from_dict(values: dict):
    """The config a checkpoint's ``config`` describes (unknown keys are left out)."""
    baseline = baselines.BASELINES.get(values.get("model"))  # "autoencoder": other dropout rates
    return (baselines.AutoencoderConfig if baseline is None else baseline.config).from_dict(values)


class BaselineTrainer:
    """Parameters, velocities and random state of one baseline run, resident on ``backend``."""

    def __init__(self, config, backend: Backend, D: int, checkpoint: Checkpoint | None = None):
        config.check()  # validated here unless the caller already did (ksae-baseline validates its options once)
        self.config, self.backend = config, backend
        self.learner = baselines.learner_of(config)  # its step and validation loss (the registry's entry)
        self.dtype = np.dtype(config.dtype)
        if checkpoint is None:
            self.rng = np.random.default_rng(config.seed)
            host_params = baselines.init_params(D, config.hidden, config.sigma, self.rng, self.dtype)
            velocities = None
            self.epoch, self.step, self.batch_in_epoch, self.epoch_perm = 0, 0, 0, None
        else:
            self.rng = np.random.default_rng()
            self.rng.bit_generator.state = checkpoint.rng_state
            host_params, velocities = checkpoint.params, checkpoint.velocities
            self.epoch, self.step = checkpoint.epoch, checkpoint.step
            self.batch_in_epoch, self.epoch_perm = checkpoint.batch_in_epoch, checkpoint.epoch_perm
        with backend.use():
            self.params = {name: backend.asarray(value, dtype=self.dtype) for name, value in host_params.items()}
            momentum = OPTIMIZERS[MOMENTUM]  # the baselines' optimizer: momentum SGD
            self.optimizer = momentum.make(self.params, config, backend.xp)
            # On the CPU kernels the same update in one pass per array (ksae_cupy.cpu.momentum), chosen once.
            self._update = momentum.cpu_step if backend.xp is np and cpu_kernels.enabled() else momentum.step
            for name, value in (velocities or {}).items():
                self.optimizer.velocities[name][...] = backend.asarray(value)
        self.stop_requested = False  # set (e.g. by a SIGTERM handler) to stop after the current step
        # The unfinished epoch's loss sum so far (a mid-epoch checkpoint's: the resumed epoch's line covers it all).
        self.tally = epochs.restored_tally(self.batch_in_epoch, None if checkpoint is None else checkpoint.epoch_tally)
        # The run folder's identity (session/runs.py), written into every checkpoint; None outside one.
        self.run_id = None if checkpoint is None else checkpoint.run_id

    @classmethod
    def load(cls, path: Path, backend: Backend) -> "BaselineTrainer":
        ckpt = load_baseline_checkpoint(path)
        return cls(config_from_dict(ckpt.config), backend, ckpt.params["W_dh"].shape[0], ckpt)

    @property
    def finished(self) -> bool:
        return self.epoch >= self.config.epochs

    def mask(self, shape, p):
        """A dropout mask of rate ``p`` drawn from the run's generator, on the device (None for ``p`` 0)."""
        return None if p == 0 else self.backend.asarray(dropout_mask(self.rng, shape, p, self.dtype))

    def batch_loss_and_grads(self, X_bd):
        """``(loss, grads)`` of one minibatch, its random numbers drawn from the run's generator."""
        return self.learner.step(self, X_bd)

    def run_epoch(self, X_train_nd, X_valid_nd=None, on_batch=None) -> BaselineReport | None:
        """Train one epoch (or the rest of an interrupted one) on device arrays.

        ``on_batch(done, total)`` follows every batch. Returns the epoch's report, or None when
        :attr:`stop_requested` stopped it midway (:attr:`batch_in_epoch` and :attr:`epoch_perm`
        then say where it stands).
        """
        return epochs.run_epochs(self, (X_train_nd, X_valid_nd), on_batch=on_batch, limit=1)

    # -- the engine's three calls (ksae_cupy.training.epochs) -----------------------------------------
    def open_epoch(self, epoch: epochs.Epoch) -> None:
        epoch.order = epochs.draw_order(self, epoch.data[0].shape[0])

    def take_step(self, epoch: epochs.Epoch, b: int) -> None:
        cfg = self.config
        loss, grads = self.batch_loss_and_grads(epoch.data[0][epoch.order[b * cfg.batch_size:(b + 1) * cfg.batch_size]])
        if not math.isfinite(loss):
            raise TrainingDiverged(f"the loss became {loss} at epoch {self.epoch + 1}, step {self.step + 1}; "
                                   f"try a smaller {{lr}} (now {cfg.lr})", loss, self.epoch + 1, self.step + 1, cfg.lr,
                                   fields=True)
        self._update(self.optimizer, self.params, grads, cfg.lr)
        self.tally.add("loss", loss)
        self.tally.add("batches", 1)

    def close_epoch(self, epoch: epochs.Epoch) -> BaselineReport:
        cfg, X_valid_nd = self.config, epoch.data[1]
        self.backend.synchronize()
        seconds = time.perf_counter() - epoch.start
        valid_loss = self.valid_loss(X_valid_nd) if X_valid_nd is not None else None
        if valid_loss is not None and not math.isfinite(valid_loss):
            raise TrainingDiverged(f"the validation loss became {valid_loss} at epoch {self.epoch + 1}; nothing was "
                                   f"saved after the last good checkpoint; try a smaller {{lr}} (now {cfg.lr})", fields=True)
        tally = epochs.end_epoch(self)
        return BaselineReport(epoch=self.epoch, step=self.step, train_loss=tally.mean("loss", "batches") or 0.0,
                              seconds=seconds, valid_loss=valid_loss)

    def valid_loss(self, X_nd) -> float:
        """Mean 0.5 ||x - xhat||^2 per row without noise: the autoencoder's clean reconstruction,
        the RBM's mean-field one (the baseline's own: :attr:`Baseline.valid_loss`)."""
        return self.learner.valid_loss(self.params, X_nd)

    def fit(self, X_nd, on_epoch=None, on_batch=None) -> dict:
        """Train the epochs left on host or device rows ``X_nd``; host parameters (None when stopped)."""
        X_dev = self.backend.asarray(X_nd, dtype=self.dtype)
        epochs.run_epochs(self, (X_dev, None), on_epoch, on_batch=on_batch)
        return self.host_params() if self.finished else None

    def host_params(self) -> dict:
        return {name: to_host(value) for name, value in self.params.items()}

    def checkpoint(self) -> Checkpoint:
        """A host copy of the whole state (what resuming needs)."""
        return Checkpoint(params=self.host_params(),
                          velocities={name: to_host(v) for name, v in self.optimizer.velocities.items()},
                          config=config_to_dict(self.config), epoch=self.epoch, step=self.step,
                          batch_in_epoch=self.batch_in_epoch, rng_state=self.rng.bit_generator.state,
                          epoch_perm=self.epoch_perm if self.batch_in_epoch else None, run_id=self.run_id,
                          epoch_tally=epochs.tally_state(self))

    def save(self, path: Path) -> None:
        save_baseline_checkpoint(path, self.checkpoint())


def save_baseline_checkpoint(path: Path, ckpt: Checkpoint) -> None:
    """Write atomically (temporary file, verify, rename), as every checkpoint of the package."""
    save_checkpoint(path, ckpt, fmt=FORMAT)


def load_baseline_checkpoint(path: Path) -> Checkpoint:
    """Read and check a baseline checkpoint; a missing, foreign or damaged file is one line."""
    return load_checkpoint(path, fmt=FORMAT, what="baseline checkpoint")


def is_baseline_run(run_dir: Path) -> bool:
    """Whether ``run_dir/checkpoint.h5`` is a baseline's; for a missing or unreadable checkpoint, whether
    config.json says a baseline run lives there (the baseline's loader then says what is wrong with the file,
    rather than ksae-train's calling the folder another command's)."""
    import h5py

    from ksae_cupy.errors import KsaeError
    from ksae_cupy.session.runs import RunFolder

    path = Path(run_dir) / "checkpoint.h5"
    try:
        with h5py.File(path, "r") as f:
            return f.attrs.get("format") == FORMAT
    except (OSError, ValueError):
        try:
            return RunFolder(Path(run_dir), kind=KIND).folder_kind() == KIND
        except KsaeError:  # config.json unreadable too: the caller's loader says so
            return False
