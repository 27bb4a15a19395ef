"""The trainer of a ``ksae-baseline`` session and what it shows: a new run's from its options, or a
resumed run's from its checkpoint with the options given applied or refused as
:data:`~ksae_cupy.supervised.commands.BASELINE` declares them; the folder's default name, the epoch
lines and the ETA."""
from __future__ import annotations

import datetime as _dt
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.supervised import baseline_trainer as bt
from ksae_cupy.supervised.baselines import BASELINES
from ksae_cupy.supervised.baseline_registry import own_settings
from ksae_cupy.supervised.commands import BASELINE
from ksae_cupy.session import resuming
from ksae_cupy.session.fields import REFUSED, named
from ksae_cupy.session.lifecycle import RunJob

REFUSED_NAMES = named(BASELINE, REFUSED)  # they shape the model or its sequence of batches


def default_run_dir(dataset: str, model: str, hidden: int, root: Path = Path("runs")) -> Path:
    """``runs/<dataset>-<model>-h<hidden>-<UTC time>`` (a user file's stem stands for its name)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    name = Path(dataset.split(":")[0]).stem if ("/" in dataset or "." in dataset) else dataset
    return root / f"{name}-{model}-h{hidden}-{stamp}"


def new_config(options):
    """The learner's configuration from the command's ``options``, validated (the one check of the options alone)."""
    if options.model is None:
        raise KsaeError(f"missing --model; use one of {', '.join(BASELINES)}")
    config = bt.config_for(options.model, hidden=options.hidden, epochs=options.epochs, batch_size=options.batch_size,
                           lr=options.lr, momentum=options.momentum, weight_decay=options.weight_decay,
                           sigma=options.sigma, seed=options.seed, dtype=options.dtype,
                           **own_settings(options.model, options))
    config.check()
    return config


def check_resumable(previous: dict, resume) -> None:
    if "model" not in previous:
        raise KsaeError(f"--resume {resume}: not a ksae-baseline run (its config.json names no model); "
                        f"continue it with the command that started it")


def resumed_trainer(folder, backend, options):
    """The run's trainer from its checkpoint, refused ``options`` checked, --epochs applied; and what changed."""
    trainer = bt.BaselineTrainer.load(folder.checkpoint, backend)
    folder.check_checkpoint(trainer.run_id)  # this folder's run, not a copy
    resuming.check_refused(REFUSED_NAMES, options, bt.config_to_dict(trainer.config))
    # --epochs (at least the epochs begun) is the one applied option the checkpoint holds
    return trainer, resuming.apply(("epochs",), options, trainer)


def check_input(config, data, dataset: str, trainer=None) -> None:
    """The data suits the learner (an RBM's rows in [0, 1]) and a resumed ``trainer``'s width."""
    from ksae_cupy.supervised.baselines import BASELINES

    baseline = BASELINES.get(bt.model_name(config))  # None: an autoencoder of other dropout rates
    if baseline is not None:
        baseline.check_input(data.X_train)  # the RBM's rows must be in [0, 1]
    if trainer is not None and trainer.params["W_dh"].shape[0] != data.dim:
        raise KsaeError(f"the checkpoint's model takes {trainer.params['W_dh'].shape[0]} dimensions, "
                        f"{dataset} has {data.dim}")


def new_trainer(config, data, backend):
    """A new run's trainer on ``data``, the batch and the device's memory checked first."""
    from ksae_cupy.training.learning_rate import check_data_varies
    from ksae_cupy.training.options import check_batch_size, check_training_memory

    check_data_varies(data.X_train, np)  # constant rows: a loss of 0 that says nothing
    check_batch_size("--batch-size", config.batch_size, len(data.X_train))
    check_training_memory(backend, data.dim, config.hidden, config.batch_size, config.dtype)
    return bt.BaselineTrainer(config, backend, data.dim)


def progress_view(trainer):
    """What :class:`~ksae_cupy.session.progress.RunProgress` reads, for a trainer without a k schedule
    (every step costs the same)."""

    class View:
        config = SimpleNamespace(batch_size=trainer.config.batch_size, epochs=trainer.config.epochs, k=1,
                                 k_start=None, k_schedule_epochs=None)
        epoch = property(lambda self: trainer.epoch)
        step = property(lambda self: trainer.step)
        batch_in_epoch = property(lambda self: trainer.batch_in_epoch)
        finished = property(lambda self: trainer.finished)

    return View()


def epoch_lines(report, trainer, progress) -> list[str]:
    """The epoch's line (loss, validation reconstruction error, speed, ETA) and, once, the estimate."""
    from ksae_cupy.session.progress import done_around
    from ksae_cupy.training.wording import format_duration

    progress.clear()
    epochs = trainer.config.epochs
    valid = f"  valid {report.valid_loss:.4f}" if report.valid_loss is not None else ""
    eta = f"  ETA {progress.eta()}" if not trainer.finished else ""
    lines = [f"epoch {report.epoch}/{epochs}  loss {report.train_loss:.4f}{valid}  {report.seconds:.1f} s{eta}"]
    per_step, left = progress.seconds_per_step(), progress.seconds_left()
    if not progress.estimated and per_step and left is not None and not trainer.finished:
        progress.estimated = True
        lines.append(f"estimate: {epochs} epochs at {per_step * progress.n_batches:.1f} s each take "
                     f"{format_duration(per_step * progress.n_batches * epochs)} on this device; "
                     f"{epochs - trainer.epoch} left, {done_around(left)}")
    return lines


class BaselineJob(RunJob):
    """What :meth:`~ksae_cupy.session.lifecycle.RunLifecycle.fit` trains for ``ksae-baseline`` (and for a layer
    ``ksae-finetune --baseline`` pretrains, whose lines start with ``prefix``): the epochs of ``trainer`` on
    the device rows, its checkpoint written to ``checkpoint``, its lines and bar by ``progress``."""

    def __init__(self, trainer, X_train, X_valid, checkpoint, progress, prefix: str = ""):
        self._trainer, self.X_train, self.X_valid = trainer, X_train, X_valid
        self.checkpoint, self.progress, self.prefix = checkpoint, progress, prefix

    def trainer(self):
        return self._trainer

    def fit(self, on_epoch, on_batch) -> None:
        """Epochs until the run ends or a stop is requested; each report to ``on_epoch``."""
        from ksae_cupy.training.epochs import run_epochs

        trainer = self._trainer
        if not trainer.stop_requested:  # a stop asked for while loading: no step taken
            run_epochs(trainer, (self.X_train, self.X_valid), on_epoch, on_batch=on_batch)

    def save(self) -> None:
        self._trainer.save(self.checkpoint)

    def epoch_lines(self, report) -> list[str]:
        return [self.prefix + line for line in epoch_lines(report, self._trainer, self.progress)]

    def on_batch(self, done: int, total: int) -> None:
        self.progress.on_batch(done, total)

    def on_end(self) -> None:
        self.progress.clear()
