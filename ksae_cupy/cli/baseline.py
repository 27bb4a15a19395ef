"""``ksae-baseline``: train one of the paper's baseline learners as a run folder, with resume.

    ksae-baseline mnist --model dropout-ae --epochs 500 --threads 1 --run-dir runs/dropout-ae
    ksae-baseline --resume runs/dropout-ae                 # after a stop, a crash or kill -9
    ksae-eval runs/dropout-ae                              # the features' classifier, as for k-sparse runs

The models are :mod:`ksae_cupy.supervised.baselines`' (``rbm``, ``dropout-ae``, ``denoising-ae``,
``dropout-denoising-ae``), trained by :class:`~ksae_cupy.supervised.baseline_trainer.BaselineTrainer`.
The run folder is a ``ksae-train`` one (:class:`~ksae_cupy.training.runs.RunFolder`: lock,
``config.json``, ``metrics.jsonl``, ``checkpoint.h5``) and the run has what a ``ksae-train`` run has,
from the same pieces: checkpoints every N epochs and M minutes (mid-epoch if need be), a progress
line with the ETA, Ctrl-C / SIGTERM / SIGHUP save and print the command that continues, and
``--resume`` continues bit for bit (options that shape the run are refused, ``--epochs`` may grow).
"""
from __future__ import annotations

import datetime as _dt
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import click

from ksae_cupy.cli.common import GivenPath, StopOnSignals, data_options, data_spec, report_errors
from ksae_cupy.errors import KsaeError
from ksae_cupy.supervised.baseline_trainer import KIND  # the run folders' kind
from ksae_cupy.training.options import check_seed

MODELS = ("rbm", "dropout-ae", "denoising-ae", "dropout-denoising-ae")  # baselines.REGULARISATION's keys
# Options that shape the model or its sequence of batches: on --resume, one that differs is refused.
REFUSED = ("model", "hidden", "batch_size", "lr", "momentum", "weight_decay", "sigma", "seed", "dtype")


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("dataset", required=False)
@click.option("--model", type=click.Choice(MODELS), default=None,
              help="The baseline: rbm (CD-1), dropout-ae (50% hidden dropout), denoising-ae (20% input dropout), "
                   "dropout-denoising-ae (both).")
@click.option("--hidden", type=int, default=1000, help="Hidden units (paper: 1000 on MNIST).")
@click.option("--epochs", type=int, default=5000, help="Epochs (the paper's unsupervised length: 5000).")
@click.option("--batch-size", type=int, default=128, help="Minibatch size.")
@click.option("--lr", type=float, default=None, help="Learning rate. [default: 0.05 (rbm), 0.003 (autoencoders)]")
@click.option("--momentum", type=float, default=0.9, help="Momentum (paper: 0.9).")
@click.option("--weight-decay", type=float, default=None,
              help="L2 weight decay on W. [default: 2e-4 (rbm), 0 (autoencoders)]")
@click.option("--sigma", type=float, default=0.01, help="Std of the Gaussian initial weights (paper: 0.01).")
@click.option("--seed", type=int, default=0, help="Seed of the initial weights, the batch order and the noise.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32",
              help="Floating-point type of the parameters and the data on the device.")
@click.option("--device", default="auto", help="auto, cpu, gpu or gpu:N.")
@click.option("--run-dir", type=GivenPath(path_type=Path), default=None,
              help="Folder for checkpoint.h5, config.json, metrics.jsonl. [default: runs/<dataset>-<model>-h<H>-<time>]")
@click.option("--checkpoint-every", type=int, default=10, help="Write a checkpoint every N epochs (and at the end).")
@click.option("--checkpoint-minutes", type=float, default=5.0,
              help="Also write one whenever this many minutes have passed, mid-epoch if need be (0: by epochs only).")
@click.option("--overwrite", is_flag=True, help="Start afresh in a --run-dir that holds another run.")
@click.option("--resume", type=GivenPath(path_type=Path), default=None,
              help="Continue the run in this folder; --epochs, --device, --checkpoint-*, --threads, --data-dir and "
                   "--progress-seconds may be given, options that would change the run are refused by name.")
@click.option("--data-dir", type=GivenPath(path_type=Path), default=None, help="Data root. [default: $KSAE_DATA_DIR or ./data]")
@click.option("--threads", type=int, default=None,
              help="Threads on the CPU for BLAS. [default: OMP_NUM_THREADS or its kin when set, else one per free "
                   "core (the load average counts the busy ones); on --resume, the run's]")
@click.option("--progress-seconds", type=float, default=30.0,
              help="When stderr is not a terminal, a progress line this often (a terminal gets a bar).")
@click.option("--quiet", is_flag=True, help="Only the final line.")
@data_options
@click.pass_context
@report_errors
def baseline_command(ctx, dataset, model, hidden, epochs, batch_size, lr, momentum, weight_decay, sigma, seed, dtype,
                     device, run_dir, checkpoint_every, checkpoint_minutes, overwrite, resume, data_dir, threads,
                     progress_seconds, quiet, **data_given):
    """Train a baseline learner of the paper (RBM, dropout / denoising autoencoders) on DATASET.

    DATASET is what ksae-train takes (a built-in name or your file, with the same data options).
    Evaluate the run folder with ksae-eval, as a k-sparse run: logistic regression on the
    features of the uncorrupted input with every hidden unit (section 5).

    \b
    Examples:
      ksae-baseline mnist --model rbm --epochs 500 --threads 1
      ksae-baseline --resume runs/mnist-rbm-h1000-20261125-160500
    """
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.cli import resume as resuming
    from ksae_cupy.cli.progress import RunProgress
    from ksae_cupy.training.threads import set_blas_threads
    from ksae_cupy.cli.train import check_progress_seconds
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.supervised import baseline_trainer as bt
    from ksae_cupy.supervised.baselines import check_rbm_input
    from ksae_cupy.training.checkpoint_policy import CheckpointPolicy
    from ksae_cupy.training.options import check_training_memory
    from ksae_cupy.training.runs import RunFolder, dataset_record

    say = (lambda *a, **kw: None) if quiet else click.echo
    typed = resuming.given(ctx)
    check_seed("--seed", seed)
    if resume is not None:
        if overwrite:
            raise KsaeError(f"--overwrite contradicts --resume: --resume continues the run in {resume}, --overwrite "
                            f"would discard it; give one")
        folder = RunFolder(resume, kind=KIND)
        folder.check_resumable()
        resuming.check_run_dir(run_dir, resume)
        folder.lock(log=lambda msg: say(msg, err=True))  # one writer: held until the command ends
        ctx.call_on_close(folder.release)
        previous = folder.read_config()
        if "model" not in previous:
            raise KsaeError(f"--resume {resume}: not a ksae-baseline run (its config.json names no model); "
                            f"continue it with the command that started it")
        dataset = resuming.check_dataset(dataset, previous)
        spec = resuming.check_data_options(typed, data_given, dataset, previous)
        every = resuming.run_level(ctx, typed, previous)  # options not given keep the run's values
        check_progress_seconds(every["progress_seconds"])
        policy = CheckpointPolicy(every["checkpoint_every"], every["checkpoint_minutes"])
        backend = resolve_device(every["device"])
        trainer = bt.BaselineTrainer.load(folder.checkpoint, backend)
        folder.check_checkpoint(trainer.run_id)  # this folder's run, not a copy
        check_refused(ctx, typed, bt.config_to_dict(trainer.config))
        changes = apply_epochs(ctx, typed, trainer)
        say(resuming.where_line(folder.path, trainer.epoch, trainer.batch_in_epoch, trainer.step)
            + (f"; applied: {', '.join(changes)}" if changes else ""))
        config = trainer.config
    else:
        if dataset is None:
            raise KsaeError("missing DATASET; give a dataset name or file, or --resume RUN_DIR")
        if model is None:
            raise KsaeError(f"missing --model; use one of {', '.join(MODELS)}")
        spec = data_spec(dataset, **data_given)
        config = bt.config_for(model, hidden=hidden, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                               weight_decay=weight_decay, sigma=sigma, seed=seed, dtype=dtype)
        config.validate()
        check_progress_seconds(progress_seconds)
        policy = CheckpointPolicy(checkpoint_every, checkpoint_minutes)
        every = resuming.run_level(ctx, typed, {})
        folder = RunFolder(run_dir or default_run_dir(dataset, model, hidden), kind=KIND)
        folder.check_new(overwrite)
        backend = resolve_device(device)
        trainer = None
    record = dataset_record(spec.data)
    if spec.is_user_file:
        record["data"] = spec.record()  # labels and splits, for ksae-eval and --resume
    data_dir = Path(every["data_dir"]) if every["data_dir"] else None

    say(backend.description)
    threads_line, every["threads"] = set_blas_threads(every["threads"])  # a resume keeps the run's count
    say(threads_line)
    data = load_dataset(spec, root=data_dir, log=lambda msg: say(msg, err=True))
    say(data.summary())
    model = bt.model_name(config)
    if model == "rbm":
        check_rbm_input(data.X_train)
    if trainer is None:
        config.validate(n_train=len(data.X_train))
        check_training_memory(backend, data.dim, config.hidden, config.batch_size, config.dtype)
        trainer = bt.BaselineTrainer(config, backend, data.dim)
    elif trainer.params["W_dh"].shape[0] != data.dim:
        raise KsaeError(f"the checkpoint's model takes {trainer.params['W_dh'].shape[0]} dimensions, "
                        f"{dataset} has {data.dim}")

    ctx.call_on_close(folder.release)
    folder.create(log=lambda msg: say(msg, err=True), new=resume is None, overwrite=overwrite)
    trainer.run_id = folder.run_id  # every checkpoint carries the folder's identity
    dropped = folder.drop_metrics_after(trainer.step, trainer.epoch, trainer.config.epochs) if resume is not None else None
    if dropped:
        say(dropped)  # which epochs, and whether each runs again
    # "baseline", not "train": the learner's options are not a ksae-train run's (which reads "train")
    resolved = {**record, "model": model, "baseline": bt.config_to_dict(trainer.config), **every,
                "device": backend.name, "data_dir": str(data_dir) if data_dir else None, "run_dir": str(folder.path)}
    folder.write_config(resolved)
    say("config: " + json.dumps(resolved["baseline"], sort_keys=True))
    say(f"run folder: {folder.path}")
    minutes = f" and every {policy.seconds / 60:g} minutes" if policy.seconds else ""
    say(f"checkpoints: {folder.checkpoint}, every {policy.every_epochs} epochs{minutes}, and at the end")

    with backend.use():
        X_train = backend.asarray(data.X_train, dtype=trainer.dtype)
        X_valid = backend.asarray(data.X_valid, dtype=trainer.dtype) if data.X_valid is not None else None
    progress = RunProgress(progress_view(trainer), len(data.X_train), enabled=not quiet, tty=sys.stderr.isatty(),
                           interval_s=every["progress_seconds"])

    def on_batch(done, total):
        progress.on_batch(done, total)
        if policy.after_batch(done, total):
            trainer.save(folder.checkpoint)

    finished_before = trainer.finished
    stop = StopOnSignals(SimpleNamespace(trainer_=trainer), say)
    started = time.perf_counter()
    policy.restart()  # the minutes count from the first step, not from loading
    try:
        while not trainer.finished and not trainer.stop_requested:
            report = trainer.run_epoch(X_train, X_valid, on_batch)
            if report is None:
                break
            folder.append_metrics(report)  # before the checkpoint: a resume drops lines past it
            if policy.after_epoch(report.epoch):
                trainer.save(folder.checkpoint)
            progress.clear()
            for line in epoch_lines(report, trainer, progress):
                say(line)
    finally:
        stop.restore()
        progress.clear()
    if finished_before:
        click.echo(f"nothing to train: the run had already trained all its {trainer.epoch} epochs (options given are "
                   f"recorded); to train longer, give --epochs N with N > {trainer.epoch}")
        return
    trainer.save(folder.checkpoint)
    if not trainer.finished:
        click.echo(f"interrupted {resuming.position(trainer.epoch, trainer.batch_in_epoch)}; checkpoint saved to "
                   f"{folder.checkpoint}; continue with: ksae-baseline --resume {folder.path}", err=True)
        sys.exit(stop.exit_status)
    click.echo(f"done: {resuming.epochs_done(trainer.epoch)} in {time.perf_counter() - started:.1f} s; checkpoint "
               f"{folder.checkpoint}; evaluate with: ksae-eval {folder.path}")


def default_run_dir(dataset: str, model: str, hidden: int, root: Path = Path("runs")) -> Path:
    """``runs/<dataset>-<model>-h<hidden>-<UTC time>`` (a user file's stem stands for its name)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    name = Path(dataset.split(":")[0]).stem if ("/" in dataset or "." in dataset) else dataset
    return root / f"{name}-{model}-h{hidden}-{stamp}"


def check_refused(ctx, typed: set, saved: dict) -> None:
    """Name every run-shaping option given on --resume whose value differs from the checkpoint's."""
    differing = []
    for name in sorted(typed & set(REFUSED)):
        value = ctx.params[name]
        if value != saved.get(name):
            differing.append(f"--{name.replace('_', '-')} {value} (the run has {saved.get(name)})")
    if differing:
        raise KsaeError("--resume: options contradict the checkpoint (they shape the model or the batches): "
                        + ", ".join(differing))


def apply_epochs(ctx, typed: set, trainer) -> list[str]:
    """``--epochs`` on --resume: at least the epochs begun (a baseline has no schedule that depends on it)."""
    epochs = ctx.params["epochs"]
    if "epochs" not in typed or epochs == trainer.config.epochs:
        return []
    done = trainer.epoch + (1 if trainer.batch_in_epoch else 0)
    if epochs < max(done, 1):
        raise KsaeError(f"--epochs {epochs} is not allowed on resume; the run has already trained {done} epochs; "
                        f"use at least {max(done, 1)}")
    change = f"epochs {trainer.config.epochs} -> {epochs}"
    trainer.config.epochs = epochs
    return [change]


def progress_view(trainer):
    """What :class:`~ksae_cupy.cli.progress.RunProgress` reads, for a trainer without a k schedule
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
    from ksae_cupy.cli.progress import format_duration

    epochs = trainer.config.epochs
    valid = f"  valid {report.valid_loss:.4f}" if report.valid_loss is not None else ""
    eta = f"  ETA {progress.eta()}" if not trainer.finished else ""
    lines = [f"epoch {report.epoch}/{epochs}  loss {report.train_loss:.4f}{valid}  {report.seconds:.1f} s{eta}"]
    per_step, left = progress.seconds_per_step(), progress.seconds_left()
    if not progress.estimated and per_step and left is not None and not trainer.finished:
        progress.estimated = True
        end = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=left)
        lines.append(f"estimate: {epochs} epochs at {per_step * progress.n_batches:.1f} s each take "
                     f"{format_duration(per_step * progress.n_batches * epochs)} on this device; "
                     f"{epochs - trainer.epoch} left, done around {end:%Y-%m-%d %H:%M} UTC")
    return lines
