"""The job of a ``ksae-train`` session (:class:`TrainJob`): a new run's trainer, from its options and made
ready on the data (:func:`~ksae_cupy.training.prepare.prepare`, as the estimator's) before anything is
written, or a resumed run's, from its checkpoint with the options given applied or refused
(:mod:`ksae_cupy.session.resuming`, as :mod:`ksae_cupy.session.fields` declares them). The command
builds its trainer here directly, not through the scikit-learn estimator, and so does each run of a pack
(:mod:`ksae_cupy.session.packed_runs`): a new one by :func:`new_job`, a resumed one by :func:`resumed_trainer`
and :meth:`TrainJob.resumed`."""
from __future__ import annotations

import sys

import numpy as np

from ksae_cupy.errors import KsaeError, cli_name
from ksae_cupy.session import resuming
from ksae_cupy.session.fields import APPLIED, REFUSED, TRAIN, named, parse_lr
from ksae_cupy.session.lifecycle import RunJob
from ksae_cupy.training import prepare

IN_CHECKPOINT = ("epochs", "topk", "step")  # applied options kept in the checkpoint's configuration


def describe_auto_lr(scale) -> str:
    """What --lr auto derived its rate from: the training rows' :class:`DataScale` against MNIST's."""
    from ksae_cupy.training.learning_rate import MNIST_MEAN_SQUARED_NORM, MNIST_TOP_EIGENVALUE

    return (f"E||x||^2 {scale.mean_squared_norm:.4g} and top eigenvalue of E[xx^T] {scale.top_eigenvalue:.4g}; "
            f"MNIST's {MNIST_MEAN_SQUARED_NORM:g} and {MNIST_TOP_EIGENVALUE:g} give 0.01")


# TrainConfig's fields beyond the paper: ksae-train offers them, the MPI trainer not (its runs take the defaults).
BEYOND_THE_PAPER = ("activation", "step", "aux_k", "aux_coef", "dead_window", "center_input", "optimizer")


def new_config(options, lr):
    """The run's :class:`TrainConfig` from the command's ``options`` (a ``TrainOptions``, or the MPI trainer's)
    and ``lr`` (--lr parsed), k-start resolved, validated: the one check of the options alone, before any data."""
    from ksae_cupy.errors import cli_name
    from ksae_cupy.schedules import resolve_k_start
    from ksae_cupy.training.trainer import TrainConfig

    if options.no_k_schedule and options.k_start is not None:
        raise KsaeError(f"--k-start {options.k_start} contradicts --no-k-schedule (which trains with k from the "
                        f"first epoch); give one")
    k_start = None if options.no_k_schedule else resolve_k_start(
        "auto" if options.k_start is None else options.k_start, options.k, options.hidden)
    config = TrainConfig(hidden=options.hidden, k=options.k, k_start=k_start, epochs=options.epochs,
                         batch_size=options.batch_size, lr=lr, momentum=options.momentum, sigma=options.sigma,
                         topk=options.topk, seed=options.seed, dtype=options.dtype,
                         **{name: getattr(options, name) for name in BEYOND_THE_PAPER if hasattr(options, name)})
    config.check()
    config.check_new(cli_name)
    return config


def kept_k_start(k_start, k: int, epochs: int):
    """The k-start a run of ``epochs`` epochs trains with when ``k_start`` is asked: ``k_start`` if its k
    schedule reaches ``k`` in those epochs, else None (a new run drops such a schedule, :func:`before_prepare`)."""
    from ksae_cupy.schedules import schedule_reaches_k

    return k_start if k_start is None or schedule_reaches_k(epochs, k, k_start) else None


def asked_k_start(k_start, saved: dict):
    """The k-start asking ``k_start`` of the run whose configuration is ``saved`` amounts to: the run's own, or
    :func:`kept_k_start` over the epochs the run's schedule was planned over (its k_schedule_epochs, else its
    epochs), as the run's own was decided when it was made. So the options that made a run whose schedule
    was dropped (k_start None; its k_schedule_epochs the epochs it was asked over) name that run, its
    epochs raised or not."""
    if k_start == saved["k_start"]:
        return k_start
    return kept_k_start(k_start, saved["k"], saved.get("k_schedule_epochs") or saved["epochs"])


def drop_unreached_schedule(config, say) -> None:
    """A new run's k schedule kept only if it reaches k in the run's epochs (:func:`kept_k_start`); else
    dropped (:meth:`~ksae_cupy.training.config.TrainConfig.drop_schedule`, which keeps the epochs it was asked
    over) and said. The one rule for ksae-train, the packed runs and the MPI trainer."""
    if kept_k_start(config.k_start, config.k, config.epochs) != config.k_start:
        say(f"note: in {config.epochs} epoch the k schedule would stay at k-start {config.k_start} and never "
            f"reach k {config.k}; training with k {config.k} from the start (as --no-k-schedule)")
        config.drop_schedule()


def before_prepare(config, data, say):
    """What a new run does before its trainer is prepared, for ksae-train and the packed runs alike: the
    schedule kept only if it reaches k (:func:`drop_unreached_schedule`), the batch size checked against the
    rows; returns the ``on_config`` that says which rate --lr auto chose."""
    from ksae_cupy.training.options import check_batch_size

    drop_unreached_schedule(config, say)
    check_batch_size("--batch-size", config.batch_size, len(data.X_train))

    def said(resolved, scale):  # the scale of what fit trains on (--center-input: the rows minus their mean)
        if resolved.lr_auto:
            say(f"--lr auto: {resolved.lr} for this data ({describe_auto_lr(scale)})")

    return said


def new_job(config, data, backend, say) -> "TrainJob":
    """The job of a new run on ``data``, its trainer made ready with ``config`` (validated by
    :func:`new_config`, and not again): :func:`before_prepare`, then --lr auto resolved and the checks before
    training (memory, the data's scale, a rate that moves the weights) made now, before the run folder is
    written."""
    said = before_prepare(config, data, say)
    # The dataset's preprocessing, and with --center-input the training rows' mean, kept with the model.
    X_nd, preprocess = prepare.centre_rows(rows(data.X_train), config.center_input, config.dtype, data.preprocess)
    trainer = prepare.prepare(X_nd, np, config, backend, cli_name, on_config=said)  # the session's device
    return TrainJob(trainer, preprocess, X_nd, valid_rows(data, preprocess))


def rows(X_nd):
    """The rows as the estimator takes them: float32 and float64 kept, any other type as float64."""
    X_nd = np.asarray(X_nd)
    return X_nd if X_nd.dtype in (np.float32, np.float64) else X_nd.astype(np.float64)


def valid_rows(data, preprocess: dict):
    """The validation rows, centred as the training rows were (None without them)."""
    return None if data.X_valid is None else prepare.centred(rows(data.X_valid), np, preprocess)


def same(name: str, value, saved: dict):
    """Where a refused option given on --resume is judged otherwise than by ``==`` (see
    :func:`~ksae_cupy.session.resuming.check_refused`)."""
    if name == "k_start":  # a schedule the run dropped when it was made, asked again: the run's own
        return (asked_k_start(value, saved) == saved["k_start"]
                or f"--k-start {value} (the run has {saved['k_start']})")
    if name == "no_k_schedule":
        has_schedule = saved["k_start"] is not None
        return not (value and has_schedule) or f"--no-k-schedule (the run has k-start {saved['k_start']})"
    if name == "lr":
        value = parse_lr(value, None)
        if (value == "auto" and bool(saved.get("lr_auto"))) or value == saved["lr"]:
            return True
        return f"--lr {value} (the run has {saved['lr']})"
    return None


def resumed_trainer(folder, backend):
    """The trainer of the run in ``folder`` (a :class:`~ksae_cupy.session.runs.RunFolder`) from its checkpoint,
    on ``backend``, checked to be that folder's run (not a copy); returns it and the run's preprocessing
    (:meth:`TrainJob.resumed` takes both, with the data). ksae-train's resume and a packed run's both load
    their run here."""
    from ksae_cupy.training.checkpoint import load_checkpoint
    from ksae_cupy.training.config import TrainConfig
    from ksae_cupy.training.trainer import Trainer

    ckpt = load_checkpoint(folder.checkpoint)
    trainer = Trainer(TrainConfig.from_dict(ckpt.config), backend, D=ckpt.params["W_dh"].shape[0], checkpoint=ckpt)
    folder.check_checkpoint(ckpt.run_id, trainer.config.to_dict())  # this folder's run, not a copy
    return trainer, dict(ckpt.preprocess)


def resumed_job(folder, backend, options):
    """The run's trainer from its checkpoint (:func:`resumed_trainer`), the refused ``options`` given checked, the
    applied ones (--epochs, --topk, --step) applied; returns it, the run's preprocessing (:meth:`TrainJob.resumed`
    takes both, with the data) and what changed."""
    trainer, preprocess = resumed_trainer(folder, backend)
    resuming.check_refused(named(TRAIN, REFUSED), options, trainer.config.to_dict(), same)
    changes = resuming.apply([n for n in named(TRAIN, APPLIED) if n in IN_CHECKPOINT], options, trainer)
    return trainer, preprocess, changes


class TrainJob(RunJob):
    """What :meth:`~ksae_cupy.session.lifecycle.RunLifecycle.fit` trains for ``ksae-train``: ``trainer`` on the
    host rows ``X_nd`` (centred as ``preprocess`` says) scored on ``X_valid_nd``; it saves itself, into the run
    folder by its checkpoint policy (:meth:`into`), and shows the session's progress."""

    saves_itself = True

    def __init__(self, trainer, preprocess: dict, X_nd, X_valid_nd):
        self._trainer, self.preprocess, self.X_nd, self.X_valid_nd = trainer, dict(preprocess), X_nd, X_valid_nd
        self.run = self.progress = None
        self.saved_at = None  # (path, epoch, step) of the last save: what a divergence says was kept

    @classmethod
    def resumed(cls, trainer, preprocess: dict, data) -> "TrainJob":
        """A resumed run's job on ``data``, its rows centred as the run's were."""
        return cls(trainer, preprocess, prepare.centred(rows(data.X_train), np, preprocess), valid_rows(data, preprocess))

    def into(self, run, quiet: bool, echo) -> None:
        """Save into ``run``'s folder (its identity in every checkpoint), by its checkpoint policy, and show the
        progress as its settings say (a bar on a terminal, else a line every ``progress_seconds``)."""
        self.run, self.quiet, self.echo = run, quiet, echo

    def trainer(self):
        return self._trainer

    def fit(self, on_epoch, on_batch) -> None:
        """The trainer's epochs up to its last; a checkpoint after each epoch the policy names and at the end
        (when a step was trained, or none is there); a diverged loss retold (what was kept, a rate to use)."""
        from ksae_cupy.training.trainer import TrainingDiverged

        trainer, checkpoint = self._trainer, self.run.folder.checkpoint
        trainer.config.check(name=cli_name)  # validated again only if --resume changed it
        X_dev, X_valid_dev = self.on_device(self.X_nd), self.on_device(self.X_valid_nd)
        step_before = trainer.step
        try:
            with trainer.backend.use():
                trainer.fit(X_dev, X_valid_dev, on_epoch, on_batch, self.run.policy.after_epoch, checkpoint=self.save)
        except TrainingDiverged as exc:
            raise self.retold(exc) from None
        # A finished run resumed again trains nothing: leave its checkpoint file untouched.
        if trainer.step != step_before or not checkpoint.exists():
            self.save()

    def retold(self, exc):
        """The divergence ``exc`` retold for the user: what the run folder keeps, and a rate that trains its rows."""
        return prepare.retold(exc, self.X_nd, self.run.folder.checkpoint, self.saved_at, self._trainer.config.sigma,
                              cli_name, rate=self._trainer.config.lr)

    def on_device(self, X_nd):
        """Host rows ``X_nd`` (None: none) on the trainer's device, in its dtype."""
        return None if X_nd is None else self._trainer.backend.asarray(X_nd, dtype=self._trainer.dtype)

    def save(self) -> None:
        self.saved_at = prepare.save_state(self._trainer, self.run.folder.checkpoint, self.preprocess,
                                           self.run.folder.run_id)

    def epoch_lines(self, report) -> list[str]:
        return self._progress().after_epoch(report)

    def on_batch(self, done: int, total: int) -> None:
        self._progress().on_batch(done, total)

    def on_end(self) -> None:
        if self.progress is not None:
            self.progress.clear()

    def _progress(self):
        """The session's :class:`RunProgress`, made at the first batch (the trainer's kernels compiled first)."""
        from ksae_cupy.session.progress import RunProgress

        if self.progress is None:
            trainer = self._trainer
            sample_nd = trainer.backend.asarray(self.X_nd[:trainer.config.batch_size])
            # Compile the validation pass's kernels now, before the progress clock starts: the
            # estimate printed after epoch 1 is then the run's pace, not the compiler's.
            trainer.evaluate_loss(sample_nd)
            self.progress = RunProgress(trainer, len(self.X_nd), enabled=not self.quiet, tty=sys.stderr.isatty(),
                                        interval_s=self.run.settings["progress_seconds"], echo=self.echo,
                                        step_cost=lambda k: trainer.step_seconds(sample_nd, k))
        return self.progress
