"""``ksae-train``: train a k-sparse autoencoder on a dataset, with checkpoints and resume.

Thin by design: parse, resolve the device, print the resolved configuration, call the library.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from ksae_cupy.cli.common import EXIT_INTERRUPTED, install_interrupt_handler, report_errors
from ksae_cupy.errors import KsaeError

# Options that shape the run; on --resume, each one given explicitly must match the checkpoint.
RUN_SHAPING = ("hidden", "k", "k_start", "no_k_schedule", "epochs", "batch_size", "lr", "momentum", "sigma",
               "seed", "dtype", "activation")


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("dataset", required=False)
@click.option("--hidden", type=int, default=1000, help="Hidden units H (paper: 1000 on MNIST).")
@click.option("--k", "k", type=int, default=25, help="Units kept per example during training.")
@click.option("--k-start", type=int, default=None,
              help="First k of the sparsity schedule (section 4.3.1). [default: 100, or k if larger, at most hidden]")
@click.option("--no-k-schedule", is_flag=True, help="Train with k from the first epoch.")
@click.option("--epochs", type=int, default=5000, help="Epochs (paper: 5000).")
@click.option("--batch-size", type=int, default=128, help="Minibatch size (authors' code: 128).")
@click.option("--lr", type=float, default=0.01, help="Learning rate eta (paper, MNIST: 0.01).")
@click.option("--momentum", type=float, default=0.9, help="Momentum m (paper: 0.9).")
@click.option("--sigma", type=float, default=0.01, help="Std of the Gaussian initial weights (paper: 0.01).")
@click.option("--topk", type=click.Choice(["sort", "threshold"]), default="sort",
              help="Top-k algorithm: selection by sorting, or iterative threshold.")
@click.option("--seed", type=int, default=0, help="Seed of the initial weights and of the batch order.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32")
@click.option("--activation", type=click.Choice(["linear", "relu"]), default="linear",
              help="Hidden units: linear (the paper) or relu (negative survivors of the top-k set to zero).")
@click.option("--step", type=click.Choice(["dense", "sparse", "auto"]), default="auto",
              help="Training step: dense products, or only the encoder dense (sparse); auto picks by k/H.")
@click.option("--device", default="auto", help="auto, cpu, gpu or gpu:N.")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None,
              help="Folder for checkpoint.h5, config.json, metrics.jsonl. [default: runs/<dataset>-h<H>-k<k>-<time>]")
@click.option("--checkpoint-every", type=int, default=10, help="Write a checkpoint every N epochs (and at the end).")
@click.option("--resume", type=click.Path(path_type=Path), default=None, help="Continue the run in this folder.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Data root. [default: $KSAE_DATA_DIR or ./data]")
@click.option("--quiet", is_flag=True, help="Only the final line.")
@click.pass_context
@report_errors
def train_command(ctx, dataset, hidden, k, k_start, no_k_schedule, epochs, batch_size, lr, momentum, sigma, topk,
                  seed, dtype, activation, step, device, run_dir, checkpoint_every, resume, data_dir, quiet):
    """Train a k-sparse autoencoder on DATASET.

    DATASET is a built-in name (mnist, synthetic, and the others `ksae-data list` shows)
    or your own N x D array: a .npy file, or file.h5[:dataset].

    \b
    Examples:
      ksae-train mnist --k 25 --epochs 5000
      ksae-train synthetic --hidden 256 --k 5 --epochs 20 --device cpu
      ksae-train --resume runs/mnist-h1000-k25-20261121-101500
    """
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.training.estimator import KSparseAutoencoder
    from ksae_cupy.training.runs import RunFolder, default_run_dir
    from ksae_cupy.schedules import resolve_k_start
    from ksae_cupy.training.trainer import TrainConfig

    explicit = {name for name in RUN_SHAPING
                if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}
    if checkpoint_every <= 0:
        raise KsaeError(f"--checkpoint-every {checkpoint_every} is not allowed; use a positive number of epochs")
    if resume is not None:
        folder = RunFolder(resume)
        folder.check_resumable()
        previous = folder.read_config()
        dataset = _check_resume_dataset(dataset, previous)
        backend = resolve_device(device)
        model = KSparseAutoencoder.load(folder.checkpoint, device=backend.name)
        _check_resume_options(ctx, explicit, model.trainer_.config, no_k_schedule)
        if ctx.get_parameter_source("step") == click.core.ParameterSource.COMMANDLINE:
            model.trainer_.config.step = step  # the same math either way: may change on resume
    else:
        if dataset is None:
            raise KsaeError("missing DATASET; give a dataset name or file, or --resume RUN_DIR")
        config = TrainConfig(hidden=hidden, k=k, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                             sigma=sigma, topk=topk, seed=seed, dtype=dtype, activation=activation, step=step,
                             k_start=None if no_k_schedule else resolve_k_start(k_start if k_start is not None else "auto", k, hidden))
        config.validate()
        folder = RunFolder(run_dir or default_run_dir(dataset, hidden, k))
        folder.check_new()
        backend = resolve_device(device)
        model = None

    say = (lambda *a, **kw: None) if quiet else click.echo
    say(backend.description)
    data = load_dataset(dataset, root=data_dir, log=lambda msg: say(msg, err=True))
    say(data.summary())
    if model is None:
        model = KSparseAutoencoder(n_hidden=config.hidden, k=config.k, k_start=config.k_start, epochs=config.epochs,
                                   batch_size=config.batch_size, lr=config.lr, momentum=config.momentum,
                                   sigma=config.sigma, topk=config.topk, seed=config.seed, dtype=config.dtype,
                                   device=backend.name, activation=config.activation, step=config.step)
        model.config().validate(n_train=len(data.X_train))
        model.preprocess_ = dict(data.preprocess)
    elif model.trainer_.params["W_dh"].shape[0] != data.dim:
        raise KsaeError(f"the checkpoint's model takes {model.trainer_.params['W_dh'].shape[0]} dimensions, "
                        f"{dataset} has {data.dim}")

    folder.create()
    resolved = {"dataset": dataset, "device": backend.name, "train": model.config().to_dict()
                if model.trainer_ is None else model.trainer_.config.to_dict(),
                "checkpoint_every": checkpoint_every, "run_dir": str(folder.path)}
    folder.write_config(resolved)
    say("config: " + json.dumps(resolved["train"], sort_keys=True))
    say(f"run folder: {folder.path}")

    progress = _BatchProgress(enabled=not quiet and sys.stderr.isatty())

    def on_epoch(report):
        progress.clear()
        folder.append_metrics(report)
        say(_epoch_line(report, model.trainer_.config.epochs))

    stop = install_interrupt_handler(model, say)
    started = time.perf_counter()
    try:
        model.fit(data.X_train, data.X_valid, on_epoch=on_epoch, on_batch=progress.update,
                  checkpoint_path=folder.checkpoint, should_checkpoint=lambda epoch: epoch % checkpoint_every == 0)
    finally:
        stop()
        progress.clear()
    trainer = model.trainer_
    if not trainer.finished:
        click.echo(f"interrupted at epoch {trainer.epoch + 1}, batch {trainer.batch_in_epoch}; checkpoint saved to "
                   f"{folder.checkpoint}; continue with: ksae-train --resume {folder.path}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo(f"done: {trainer.epoch} epochs in {time.perf_counter() - started:.1f} s; "
               f"checkpoint {folder.checkpoint}")


def _check_resume_dataset(dataset, previous: dict) -> str:
    if dataset is not None and dataset != previous.get("dataset"):
        raise KsaeError(f"--resume: DATASET {dataset!r} contradicts the run's dataset {previous.get('dataset')!r}")
    return previous["dataset"]


def _check_resume_options(ctx, explicit: set, config, no_k_schedule: bool) -> None:
    """Name every explicitly given option whose value differs from the checkpoint's."""
    saved = config.to_dict()
    differing = []
    for name in explicit:
        given = ctx.params[name]
        if name == "no_k_schedule":
            if given and saved["k_start"] is not None:
                differing.append(f"--no-k-schedule (the run has k-start {saved['k_start']})")
            continue
        if given != saved[name]:
            differing.append(f"--{name.replace('_', '-')} {given} (the run has {saved[name]})")
    if differing:
        raise KsaeError("--resume: options contradict the checkpoint: " + ", ".join(sorted(differing)))


def _epoch_line(report, epochs: int) -> str:
    valid = f"  valid {report.valid_loss:.4f}" if report.valid_loss is not None else ""
    return (f"epoch {report.epoch}/{epochs}  k {report.k}  loss {report.train_loss:.4f}{valid}  "
            f"dead {100 * report.dead_fraction:.1f}%  {report.samples_per_s:,.0f} samples/s  {report.seconds:.1f} s")


class _BatchProgress:
    """A one-line progress bar on a terminal, redrawn at most 10 times a second."""

    def __init__(self, enabled: bool):
        self.enabled, self.last = enabled, 0.0

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.enabled and (now - self.last > 0.1 or done == total):
            self.last = now
            width = 30
            filled = width * done // total
            click.echo(f"\r  [{'#' * filled}{'.' * (width - filled)}] batch {done}/{total}", nl=False, err=True)

    def clear(self) -> None:
        if self.enabled:
            click.echo("\r" + " " * 60 + "\r", nl=False, err=True)
