"""Command-line entry points: ``ksae-train``, ``ksae-data``, ``ksae-bench``.

Thin by design: parse, resolve the device, print the resolved configuration, call the
library. A user mistake is one line ``error: ...`` on stderr and exit status 2; a run
whose loss diverges exits with status 1; Ctrl-C saves a checkpoint and exits with 130.
"""
from __future__ import annotations

import functools
import json
import signal
import sys
import time
from pathlib import Path

import click

from .errors import KsaeError

EXIT_USAGE, EXIT_DIVERGED, EXIT_INTERRUPTED = 2, 1, 130


def report_errors(func):
    """Turn :class:`KsaeError` into ``error: <one line>`` and the right exit status."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from .train import TrainingDiverged

        try:
            return func(*args, **kwargs)
        except TrainingDiverged as exc:
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(EXIT_DIVERGED)
        except KsaeError as exc:
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(EXIT_USAGE)

    return wrapper


def _one_line(exc: Exception) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


# -- ksae-train ------------------------------------------------------------------------

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
                  seed, dtype, activation, device, run_dir, checkpoint_every, resume, data_dir, quiet):
    """Train a k-sparse autoencoder on DATASET.

    DATASET is a built-in name (mnist, synthetic, and the others `ksae-data list` shows)
    or your own N x D array: a .npy file, or file.h5[:dataset].

    \b
    Examples:
      ksae-train mnist --k 25 --epochs 5000
      ksae-train synthetic --hidden 256 --k 5 --epochs 20 --device cpu
      ksae-train --resume runs/mnist-h1000-k25-20261121-101500
    """
    from .backend import resolve_device
    from .datasets import load_dataset
    from .estimator import KSparseAutoencoder
    from .runs import RunFolder, default_run_dir
    from .schedules import resolve_k_start
    from .train import TrainConfig

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
    else:
        if dataset is None:
            raise KsaeError("missing DATASET; give a dataset name or file, or --resume RUN_DIR")
        config = TrainConfig(hidden=hidden, k=k, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                             sigma=sigma, topk=topk, seed=seed, dtype=dtype, activation=activation,
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
                                   device=backend.name, activation=config.activation)
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

    stop = _install_interrupt_handler(model, say)
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


def _install_interrupt_handler(model, say):
    """First Ctrl-C: finish the current step, save, exit. Second: stop at once. Returns an undo."""
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        if model.trainer_ is not None and not model.trainer_.stop_requested:
            model.trainer_.stop_requested = True
            say("\nCtrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to abort without saving)",
                err=True)
        else:
            raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread (e.g. inside a test runner's worker)
        return lambda: None
    return lambda: signal.signal(signal.SIGINT, previous)


# -- ksae-data -------------------------------------------------------------------------

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def data_command():
    """Fetch, verify and list the datasets under the data root ($KSAE_DATA_DIR or ./data)."""


@data_command.command("fetch")
@click.argument("name")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Data root.")
@report_errors
def data_fetch(name, data_dir):
    """Download NAME's files, verify their SHA-256 and put them in place."""
    from .datasets import data_root
    from .datasets.catalog import fetch_dataset

    root = data_dir or data_root()
    paths = fetch_dataset(name, root, log=lambda msg: click.echo(msg, err=True))
    for path in paths.values():
        click.echo(f"ok  {path}")


@data_command.command("verify")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Data root.")
@report_errors
def data_verify(data_dir):
    """Check every dataset file present under the data root; name the bad ones."""
    from .datasets import data_root
    from .datasets.catalog import verify_all

    rows = verify_all(data_dir or data_root())
    bad = [row for row in rows if row[2] == "bad"]
    for dataset, filename, status, detail in rows:
        click.echo(f"{status:8s} {dataset:14s} {filename}{'  ' + detail if detail else ''}")
    if bad:
        raise KsaeError(f"{len(bad)} file(s) fail verification: " + ", ".join(f"{d}/{f}" for d, f, _, _ in bad))


@data_command.command("list")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Data root.")
@report_errors
def data_list(data_dir):
    """The built-in datasets and whether their files are present."""
    from .datasets import data_root
    from .datasets.catalog import list_datasets

    for name, description, state in list_datasets(data_dir or data_root()):
        click.echo(f"{name:14s} {state:44s} {description}")


# -- ksae-bench ------------------------------------------------------------------------

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def bench_command():
    """Benchmarks; each validates before it times and writes JSON under benchmarks/results/."""


@bench_command.command("train")
@click.option("--device", default="cpu", help="cpu, or gpu / gpu:N (then: seconds per MNIST epoch, ours vs PyTorch).")
@click.option("--hidden", type=int, default=1000)
@click.option("--dim", type=int, default=784)
@click.option("--k", "k", type=int, default=25)
@click.option("--batch-size", type=int, default=128)
@click.option("--topk", type=click.Choice(["sort", "threshold"]), default="sort")
@click.option("--repeats", type=int, default=7, help="Timed repeats; the median is reported.")
@click.option("--steps", type=int, default=50, help="Steps per timed repeat.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Results folder. [default: benchmarks/results]")
@report_errors
def bench_train(device, hidden, dim, k, batch_size, topk, repeats, steps, out):
    """Training-step speed on MNIST shapes, against the step's matrix products alone."""
    from .backend import resolve_device
    from .bench import bench_train_step
    from .benchmeta import write_results

    backend = resolve_device(device)
    click.echo(backend.description)
    if backend.is_gpu:
        from .bench_gpu import bench_train_gpu

        result = bench_train_gpu(D=dim, H=hidden, k=k, batch=batch_size, device=backend.gpu_index, out_dir=out)
        click.echo(json.dumps({key: value for key, value in result.items() if key != "meta"}, indent=1, default=str))
        return
    result = bench_train_step(backend, D=dim, H=hidden, k=k, batch_size=batch_size, topk_method=topk,
                              repeats=repeats, steps=steps, log=click.echo)
    path = write_results(f"train-{backend.name.replace(':', '')}", result, out)
    click.echo(f"results: {path}")


@bench_command.command("dist")
@click.option("--ranks", default="1,2,3", help="Comma-separated rank counts; one MPI job each (more ranks than cores oversubscribe).")
@click.option("--threads", type=int, default=1, help="BLAS threads per rank.")
@click.option("--baseline-threads", type=int, default=None,
              help="Also time one rank with this many BLAS threads (0: no). [default: the CPU count]")
@click.option("--hidden", type=int, default=1000)
@click.option("--dim", type=int, default=784)
@click.option("--k", "k", type=int, default=25)
@click.option("--batch-size", type=int, default=128, help="The GLOBAL minibatch, split over the ranks.")
@click.option("--topk-k", "topk_ks", default="25,250", help="Comma-separated k values for the sharded top-k.")
@click.option("--formula-ranks", default="1,2,4,8,16", help="Rank counts of the computed traffic table.")
@click.option("--repeats", type=int, default=7, help="Timed repeats; the median is reported.")
@click.option("--steps", type=int, default=20, help="Steps per timed repeat.")
@click.option("--topk-repeats", type=int, default=21, help="Timed calls of each sharded top-k.")
@click.option("--mpiexec", default=None, help="[default: the mpiexec beside this Python, else on PATH]")
@click.option("--timeout", type=float, default=600.0, help="Seconds each MPI job may run.")
@click.option("--note", default="", help="A line for the Markdown summary (e.g. that the machine was shared).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Results folder. [default: benchmarks/results]")
@report_errors
def bench_dist_command(ranks, threads, baseline_threads, hidden, dim, k, batch_size, topk_ks, formula_ranks,
                       repeats, steps, topk_repeats, mpiexec, timeout, note, out):
    """Data-parallel step vs one process, all-reduce time, and sharded top-k traffic (MPI, CPU)."""
    import os

    from .bench_dist import bench_dist, markdown
    from .benchmeta import write_results

    for flag, value in (("--threads", threads), ("--hidden", hidden), ("--dim", dim), ("--batch-size", batch_size),
                        ("--repeats", repeats), ("--steps", steps), ("--topk-repeats", topk_repeats)):
        if value <= 0:
            raise KsaeError(f"{flag} {value} is not allowed; use a positive number")
    if baseline_threads is None:
        baseline_threads = os.cpu_count() or 1
    if baseline_threads < 0:
        raise KsaeError(f"--baseline-threads {baseline_threads} is not allowed; use 0 (none) or a positive number")
    result = bench_dist(ranks=_positive_ints(ranks, "--ranks"), threads=threads, baseline_threads=baseline_threads,
                        D=dim, H=hidden, N=batch_size, k=k, topk_ks=_positive_ints(topk_ks, "--topk-k"),
                        formula_ranks=_positive_ints(formula_ranks, "--formula-ranks"), repeats=repeats, steps=steps,
                        topk_repeats=topk_repeats, mpiexec=mpiexec, timeout=timeout, log=click.echo)
    path = write_results("dist-cpu", result, out)
    summary = markdown(result, note)
    path.with_suffix(".md").write_text(summary)
    click.echo(summary)
    click.echo(f"results: {path} and {path.with_suffix('.md')}")


@bench_command.command("topk")
@click.option("--device", default="gpu", help="gpu or gpu:N.")
@click.option("--N", "Ns", default="128,4096,65536", help="Comma-separated batch sizes.")
@click.option("--H", "Hs", default="1000,4000,16384", help="Comma-separated row lengths.")
@click.option("--k", "ks", default="25,150,512", help="Comma-separated k values (k <= H).")
@click.option("--repeats", type=int, default=50)
@click.option("--no-torch", is_flag=True, help="Leave torch.topk out even when torch imports.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Results folder. [default: benchmarks/results]")
@report_errors
def bench_topk_command(device, Ns, Hs, ks, repeats, no_torch, out):
    """Both top-k kernels against cupy (argpartition, sort) and torch.topk, validated then timed."""
    from .backend import resolve_device
    from .bench_gpu import bench_topk

    backend = resolve_device(device)
    if not backend.is_gpu:
        raise KsaeError(f"--device {device}: ksae-bench topk times CUDA kernels; use --device gpu[:N]")
    click.echo(backend.description)
    parse = lambda text, flag: tuple(_positive_ints(text, flag))
    result = bench_topk(Ns=parse(Ns, "--N"), Hs=parse(Hs, "--H"), ks=parse(ks, "--k"), repeats=repeats,
                        device=backend.gpu_index, include_torch=not no_torch, out_dir=out)
    click.echo(f"results: {result.get('path')}")


def _positive_ints(text: str, flag: str):
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise KsaeError(f"{flag} {text!r} is not allowed; use comma-separated positive integers") from None
    if not values or min(values) <= 0:
        raise KsaeError(f"{flag} {text!r} is not allowed; use comma-separated positive integers")
    return values
