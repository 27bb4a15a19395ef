"""The model of a ``ksae-train`` session: a new run's, from its options and checked against the data
before anything is written, or a resumed run's, from its checkpoint with the options given applied
or refused (:mod:`ksae_cupy.session.resuming`, as :mod:`ksae_cupy.session.fields` declares them)."""
from __future__ import annotations

import sys

from ksae_cupy.errors import KsaeError
from ksae_cupy.session import resuming
from ksae_cupy.session.fields import APPLIED, REFUSED, TRAIN, named, parse_lr

# Built-in datasets whose default rate is --lr auto: the paper's 0.01 diverges on them.
AUTO_LR_DATASETS = ("fashion-mnist",)
IN_CHECKPOINT = ("epochs", "topk", "step")  # applied options kept in the checkpoint's configuration


def describe_auto_lr(scale) -> str:
    """What --lr auto derived its rate from: the training rows' :class:`DataScale` against MNIST's."""
    from ksae_cupy.training.learning_rate import MNIST_MEAN_SQUARED_NORM, MNIST_TOP_EIGENVALUE

    return (f"E||x||^2 {scale.mean_squared_norm:.4g} and top eigenvalue of E[xx^T] {scale.top_eigenvalue:.4g}; "
            f"MNIST's {MNIST_MEAN_SQUARED_NORM:g} and {MNIST_TOP_EIGENVALUE:g} give 0.01")


def new_config(values: dict, lr):
    """The run's :class:`TrainConfig` from the options (k-start resolved), validated: the one check of
    the options alone, before any data is read."""
    from ksae_cupy.errors import cli_name
    from ksae_cupy.schedules import resolve_k_start
    from ksae_cupy.training.trainer import TrainConfig

    if values["no_k_schedule"] and values["k_start"] is not None:
        raise KsaeError(f"--k-start {values['k_start']} contradicts --no-k-schedule (which trains with k from the "
                        f"first epoch); give one")
    fields = {name: values[name] for name in TrainConfig.__dataclass_fields__ if name in values and name != "k_start"}
    k_start = values["k_start"] if values["k_start"] is not None else "auto"
    config = TrainConfig(**{**fields, "lr": lr, "k_start": None if values["no_k_schedule"]
                            else resolve_k_start(k_start, values["k"], values["hidden"])})
    config.check()
    config.check_new(cli_name)
    return config


def new_model(config, data, backend, say):
    """The estimator of a new run on ``data``, prepared (:meth:`KSparseAutoencoder.prepare`) with ``config``
    (validated by :func:`new_config`, and not again): the schedule kept only if it reaches k, --lr auto
    resolved and said, and the checks fit makes (memory, the data's scale, a rate that moves the weights)
    made now, before the run folder is written; ``fit(data.X_train)`` then trains the trainer built here."""
    from ksae_cupy.errors import cli_name
    from ksae_cupy.schedules import schedule_reaches_k
    from ksae_cupy.training.estimator import KSparseAutoencoder
    from ksae_cupy.training.options import check_batch_size

    if config.k_start is not None and not schedule_reaches_k(config.epochs, config.k, config.k_start):
        say(f"note: in {config.epochs} epoch the k schedule would stay at k-start {config.k_start} and never "
            f"reach k {config.k}; training with k {config.k} from the start (as --no-k-schedule)")
        config.drop_schedule()
    params = {name: getattr(config, name) for name in config.to_dict() if name not in ("hidden", "k_schedule_epochs",
                                                                                           "lr_auto")}
    model = KSparseAutoencoder(n_hidden=config.hidden, device=backend.name, **params)
    check_batch_size("--batch-size", config.batch_size, len(data.X_train))
    model.preprocess_ = dict(data.preprocess)  # before prepare, which adds the mean --center-input subtracts

    def said(resolved, scale):  # the scale of what fit trains on (--center-input: the rows minus their mean)
        if resolved.lr_auto:
            say(f"--lr auto: {resolved.lr} for this data ({describe_auto_lr(scale)})")

    model.prepare(data.X_train, config=config, option_names=cli_name, on_config=said)
    return model, config


def same(name: str, value, saved: dict):
    """Where a refused option given on --resume is judged otherwise than by ``==`` (see
    :func:`~ksae_cupy.session.resuming.check_refused`)."""
    if name == "no_k_schedule":
        has_schedule = saved["k_start"] is not None
        return not (value and has_schedule) or f"--no-k-schedule (the run has k-start {saved['k_start']})"
    if name == "lr":
        value = parse_lr(value, None)
        if (value == "auto" and bool(saved.get("lr_auto"))) or value == saved["lr"]:
            return True
        return f"--lr {value} (the run has {saved['lr']})"
    return None


def resumed_model(folder, backend, values: dict, given: set):
    """The run's estimator from its checkpoint, the refused options given checked, the applied ones
    (--epochs, --topk, --step) applied; returns it and what changed."""
    from ksae_cupy.training.estimator import KSparseAutoencoder

    model = KSparseAutoencoder.load(folder.checkpoint, device=backend.name)
    folder.check_checkpoint(model.run_id_, model.trainer_.config.to_dict())  # this folder's run, not a copy
    model.run_id_ = folder.run_id
    trainer = model.trainer_
    resuming.check_refused(named(TRAIN, REFUSED), given, values, trainer.config.to_dict(), same)
    changes = resuming.apply([n for n in named(TRAIN, APPLIED) if n in IN_CHECKPOINT], given, values, trainer)
    model.epochs, model.topk = trainer.config.epochs, trainer.config.topk
    return model, changes


def progress(model, data, quiet: bool, interval_s: float, echo):
    """``progress()``: the session's :class:`RunProgress`, made once fit has made the trainer."""
    from ksae_cupy.session.progress import RunProgress

    def made():
        if made.made is None:
            trainer, sample_nd = model.trainer_, data.X_train[:model.trainer_.config.batch_size]
            # Compile the validation pass's kernels now, before the progress clock starts: the
            # estimate printed after epoch 1 is then the run's pace, not the compiler's.
            trainer.evaluate_loss(trainer.backend.asarray(sample_nd))
            made.made = RunProgress(trainer, len(data.X_train), enabled=not quiet, tty=sys.stderr.isatty(),
                                    interval_s=interval_s, echo=echo,
                                    step_cost=lambda k: trainer.step_seconds(trainer.backend.asarray(sample_nd), k))
        return made.made

    made.made = None
    return made
