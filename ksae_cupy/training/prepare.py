"""A fresh training made ready, the same for the estimator and the commands: the rows centred (or not),
the configuration's ``"auto"`` rate resolved, the checks that read the rows (memory, the data's scale, a
rate that moves the weights), then the :class:`Trainer`; and a diverged run retold for its caller.

    X_nd, preprocess = centre_rows(X_nd, config.center_input, config.dtype, preprocess)
    trainer = prepare(X_nd, xp, config, device, option_names)

:class:`~ksae_cupy.training.estimator.KSparseAutoencoder` (the Python API) and ``ksae-train``
(:mod:`ksae_cupy.session.train_run`) both build their trainer here. It sits in ``training/``, not in
``session/``: the estimator belongs to training and may not import the command session above it, so
the one ``prepare`` both call sits below both, and the session calls down into it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ksae_cupy.backend import Backend, resolve_device, to_host
from ksae_cupy.datasets.preprocess import INPUT_MEAN
from ksae_cupy.training.config import TrainConfig
from ksae_cupy.training.learning_rate import (auto_learning_rate, check_data_scale, check_data_varies,
                                              check_rate_moves_weights, round_significant, scale_of)
from ksae_cupy.training.options import check_training_memory
from ksae_cupy.training.trainer import Trainer, TrainingDiverged


def centre_rows(X_nd, center_input: bool, dtype: str, preprocess: dict):
    """The rows a fresh fit trains on and the preprocessing kept with the model: with ``center_input``,
    ``X_nd`` minus its mean (in ``dtype``, summed in float64, on X's device), kept as ``INPUT_MEAN``;
    without, as they are, and no mean kept."""
    preprocess = dict(preprocess)
    preprocess.pop(INPUT_MEAN, None)
    if center_input:
        mean_d = X_nd.mean(axis=0, dtype=np.float64).astype(dtype)
        preprocess[INPUT_MEAN] = to_host(mean_d)
        X_nd = X_nd - mean_d.astype(X_nd.dtype)  # as centred() subtracts it
    return X_nd, preprocess


def centred(X_nd, xp, preprocess: dict):
    """``X_nd`` (of array module ``xp``) minus the training mean when the model was trained on centred
    inputs (``preprocess`` holds it), else as it is."""
    mean_d = preprocess.get(INPUT_MEAN)
    if mean_d is None:
        return X_nd
    return X_nd - (xp.asarray(mean_d) if xp is not np else mean_d).astype(X_nd.dtype)


def prepare(X_nd, xp, config: TrainConfig, device, option_names, on_config=None) -> Trainer:
    """The trainer of a fresh fit on the rows ``X_nd`` (of array module ``xp``), on ``device`` (a
    :class:`~ksae_cupy.backend.Backend` a command resolved already, or the estimator's ``device`` string,
    resolved here after the configuration's checks), after the checks that read them. ``config``'s ``"auto"`` rate is resolved in place from the rows' scale, then ``on_config(config,
    scale)`` is called (``ksae-train`` says there which rate it chose); ``option_names(field)`` spells the
    options in messages (flags for a command, parameters for the estimator)."""
    check_data_varies(X_nd, xp, centred_by=option_names("center_input") if config.center_input else None)  # constant or all-zero rows would train to a loss of 0 that means nothing
    scale = scale_of(X_nd, xp)  # what the checks read of the rows, measured once
    if config.lr == "auto":
        config.resolve_lr(scale.auto_lr())
    if on_config is not None:
        on_config(config, scale)
    if isinstance(config.batch_size, (int, np.integer)):
        config.batch_size = min(config.batch_size, scale.rows)  # so no more rows than X's to check for
    config.check(name=option_names)
    config.check_new(name=option_names, refuse=False)  # a grid search may pair aux_coef with aux_k=0
    backend = device if isinstance(device, Backend) else resolve_device(device)
    D = X_nd.shape[1]
    # Before anything is allocated (10^9 hidden units would ask for 477 GiB).
    check_training_memory(backend, D, config.hidden, config.batch_size, config.dtype, flag=option_names("hidden"))
    check_data_scale(scale, config, option_names("lr"))  # data this scale would diverge: say so, not blame lr
    trainer = Trainer(config, backend, D=D)
    # a step of 0 would train for nothing: checked on the first batch
    check_rate_moves_weights(trainer, X_nd[:config.batch_size], option_names("lr"))
    return trainer


def retold(exc: TrainingDiverged, X_nd, checkpoint_path, saved_at, sigma, option_names,
           rate: float | None = None) -> TrainingDiverged:
    """``exc`` retold for the caller: what was saved (``saved_at``: the last save's ``(path, epoch, step)``,
    or None), and a rate that trains the rows ``X_nd``; ``rate``: the run's, where ``exc`` does not name it (an
    epoch's health check)."""
    lr = option_names("lr")
    if exc.lr is None and isinstance(rate, (int, float)):
        exc.lr = rate
    if checkpoint_path is None:
        kept = "no checkpoint was asked for; fit again from the start"
    elif saved_at is not None and Path(saved_at[0]) == Path(checkpoint_path):
        kept = f"the checkpoint {checkpoint_path} holds epoch {saved_at[1]}, step {saved_at[2]}, written before it"
    elif Path(checkpoint_path).exists():
        kept = f"the checkpoint {checkpoint_path} is as it was before this run started"
    else:
        kept = "nothing was saved (no checkpoint had been written yet)"
    auto = auto_learning_rate(X_nd)
    if exc.step == 1 and exc.loss is not None:  # the first batch's loss, before any update
        advice = (f"that is the initial model's loss on the first batch, before any step (the rate played no "
                  f"part yet): use a smaller {option_names('sigma')} (now {sigma}) or scale the data down")
    elif exc.lr is not None and exc.lr > auto:
        advice = (f"{lr} auto gives {auto} for this data (derived from its scale: 0.01 on MNIST; see the "
                  f"learning rate in docs/guide/your-data.md); use it, or a smaller rate")
    else:
        smaller = round_significant((exc.lr or auto) / 4, 2)
        advice = (f"that is at or below the {auto} that {lr} auto gives for this data; use a smaller rate, "
                  f"e.g. {smaller}, or scale the data down")
    # A batch's loss names where; the epoch's health check (summed or validation loss, parameters) says it itself.
    what = (f"the loss became {exc.loss} at epoch {exc.epoch}, step {exc.step} with {lr} {exc.lr}"
            if exc.loss is not None else str(exc).split(";")[0])
    return TrainingDiverged(f"{what}; {kept}; {advice}", exc.loss, exc.epoch, exc.step, exc.lr)


def save_state(trainer: Trainer, path, preprocess: dict, run_id: str | None) -> tuple:
    """Write the whole training state (``preprocess`` and the run folder's ``run_id`` with it) to ``path``
    atomically; returns ``(path, epoch, step)``, what :func:`retold` says was saved."""
    from ksae_cupy.training.checkpoint import save_checkpoint

    trainer.check_params_finite()
    ckpt = trainer.checkpoint(preprocess)
    ckpt.run_id = run_id
    save_checkpoint(Path(path), ckpt)
    return Path(path), trainer.epoch, trainer.step
