"""``ksae-train``: train a k-sparse autoencoder on a dataset, with checkpoints and resume.

Thin by design: parse, resolve the device, print the resolved configuration, call the library.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from ksae_cupy.cli.common import GivenPath, StopOnSignals, data_options, data_spec, parse_lr, report_errors
from ksae_cupy.errors import KsaeError, cli_name
from ksae_cupy.training.options import check_seed, check_training_memory

# Built-in datasets whose default rate is --lr auto: the paper's 0.01 diverges on them.
AUTO_LR_DATASETS = ("fashion-mnist",)


def describe_auto_lr(X_nd) -> str:
    from ksae_cupy.training.learning_rate import (MNIST_MEAN_SQUARED_NORM, MNIST_TOP_EIGENVALUE, mean_squared_norm,
                                                  top_eigenvalue)

    return (f"E||x||^2 {mean_squared_norm(X_nd):.4g} and top eigenvalue of E[xx^T] {top_eigenvalue(X_nd):.4g}; "
            f"MNIST's {MNIST_MEAN_SQUARED_NORM:g} and {MNIST_TOP_EIGENVALUE:g} give 0.01")

@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("dataset", required=False)
@click.option("--hidden", type=int, default=1000, help="Hidden units H (paper: 1000 on MNIST).")
@click.option("--k", "k", type=int, default=25, help="Units kept per example during training.")
@click.option("--k-start", type=int, default=None,
              help="First k of the sparsity schedule (section 4.3.1). [default: 100, or k if larger, at most hidden]")
@click.option("--no-k-schedule", is_flag=True, help="Train with k from the first epoch.")
@click.option("--epochs", type=int, default=5000, help="Epochs (paper: 5000).")
@click.option("--batch-size", type=int, default=128, help="Minibatch size (authors' code: 128).")
@click.option("--lr", default=None,
              help="Learning rate eta, or auto: derived from the data's scale (0.01 on MNIST). "
                   "[default: 0.01 (the paper's) for the built-in datasets but fashion-mnist; auto for it and your files]")
@click.option("--momentum", type=float, default=0.9, help="Momentum m (paper: 0.9).")
@click.option("--sigma", type=float, default=0.01, help="Std of the Gaussian initial weights (paper: 0.01).")
@click.option("--topk", type=click.Choice(["sort", "threshold"]), default="sort",
              help="Top-k algorithm: selection by sorting, or iterative threshold.")
@click.option("--seed", type=int, default=0, help="Seed of the initial weights and of the batch order.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32",
              help="Floating-point type of the parameters and the data on the device.")
@click.option("--activation", type=click.Choice(["linear", "relu"]), default="linear",
              help="Hidden units: linear (the paper) or relu (negative survivors of the top-k set to zero).")
@click.option("--step", type=click.Choice(["dense", "sparse", "auto"]), default="auto",
              help="Training step: dense products, or only the encoder dense (sparse); auto picks by k/H.")
@click.option("--aux-k", type=int, default=0,
              help="Beyond the paper: the auxiliary loss of Gao et al. 2024 on this many dead units per example "
                   "(0: off).")
@click.option("--aux-coef", type=float, default=1 / 32, help="Weight of the --aux-k loss (Gao et al.'s 1/32).")
@click.option("--dead-window", type=int, default=10000,
              help="A unit kept in none of the last N examples is dead (--aux-k, and the dead-window metric).")
@click.option("--center-input", is_flag=True,
              help="Beyond the paper: subtract the training mean from every input (kept with the model).")
@click.option("--device", default="auto", help="auto, cpu, gpu or gpu:N.")
@click.option("--run-dir", type=GivenPath(path_type=Path), default=None,
              help="Folder for checkpoint.h5, config.json, metrics.jsonl. [default: runs/<dataset>-h<H>-k<k>-<time>]")
@click.option("--checkpoint-every", type=int, default=10, help="Write a checkpoint every N epochs (and at the end).")
@click.option("--checkpoint-minutes", type=float, default=5.0,
              help="Also write one whenever this many minutes have passed, mid-epoch if need be (0: by epochs only).")
@click.option("--overwrite", is_flag=True,
              help="Start afresh in a --run-dir that holds another run: its checkpoint, config, metrics and results are removed.")
@click.option("--resume", type=GivenPath(path_type=Path), default=None,
              help="Continue the run in this folder; options given are applied (--epochs, --topk, --device, "
                   "--checkpoint-*, --threads) or, if they would change the model, refused by name.")
@click.option("--data-dir", type=GivenPath(path_type=Path), default=None, help="Data root. [default: $KSAE_DATA_DIR or ./data]")
@click.option("--threads", type=int, default=None,
              help="Threads on the CPU, for BLAS and the CPU kernels. [default: OMP_NUM_THREADS or its kin when "
                   "set, else one per free core (the load average counts the busy ones); on --resume, the run's]")
@click.option("--progress-seconds", type=float, default=30.0,
              help="When stderr is not a terminal, a progress line this often (a terminal gets a bar).")
@click.option("--quiet", is_flag=True, help="Only the final line.")
@data_options
@click.pass_context
@report_errors
def train_command(ctx, dataset, hidden, k, k_start, no_k_schedule, epochs, batch_size, lr, momentum, sigma, topk,
                  seed, dtype, activation, step, aux_k, aux_coef, dead_window, center_input, device, run_dir,
                  checkpoint_every, checkpoint_minutes, overwrite,
                  resume, data_dir, threads, progress_seconds, quiet, **data_given):
    """Train a k-sparse autoencoder on DATASET.

    DATASET is a built-in name (mnist, fashion-mnist, synthetic, and the others `ksae-data
    list` shows) or your own data: an .npz holding X (N x D) and, optionally, y, X_test and
    y_test; an .npy file; or file.h5[:dataset]. Labels and splits of your own data are set
    with --labels, --test, --valid-fraction and the options below; ksae-eval then reads them
    from the run folder.

    \b
    Examples:
      ksae-train mnist --k 25 --epochs 5000
      ksae-train mydata.npz --k 25 --epochs 20          (then: ksae-eval runs/mydata-h1000-k25-...)
      ksae-train features.h5:X --labels features.h5:y --test-fraction 0.1
      ksae-train synthetic --hidden 256 --k 5 --epochs 20 --device cpu
      ksae-train --resume runs/mnist-h1000-k25-20261121-101500
    """
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.cli import resume as resuming
    from ksae_cupy.cli.progress import RunProgress
    from ksae_cupy.training.threads import set_blas_threads
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.training.checkpoint import CheckpointWriteError
    from ksae_cupy.training.checkpoint_policy import CheckpointPolicy
    from ksae_cupy.training.estimator import KSparseAutoencoder
    from ksae_cupy.training.runs import RunFolder, dataset_record, default_run_dir
    from ksae_cupy.schedules import resolve_k_start, schedule_reaches_k
    from ksae_cupy.training.trainer import TrainConfig

    say = (lambda *a, **kw: None) if quiet else click.echo
    typed = resuming.given(ctx)
    check_seed("--seed", seed)  # paths are checked by RunFolder, memory once the data's width is known
    if resume is not None:
        if overwrite:
            raise KsaeError(f"--overwrite contradicts --resume: --resume continues the run in {resume}, --overwrite "
                            f"would discard it; give one")
        folder = RunFolder(resume)
        folder.check_resumable()
        resuming.check_run_dir(run_dir, resume)
        folder.lock(log=lambda msg: say(msg, err=True))  # one writer: held until the command ends
        ctx.call_on_close(folder.release)
        previous = folder.read_config()
        dataset = resuming.check_dataset(dataset, previous)
        spec = resuming.check_data_options(typed, data_given, dataset, previous)
        every = resuming.run_level(ctx, typed, previous)  # options not given keep the run's values
        device, threads, progress_seconds = every["device"], every["threads"], every["progress_seconds"]
        data_dir = Path(every["data_dir"]) if every["data_dir"] else None
        check_progress_seconds(progress_seconds)
        policy = CheckpointPolicy(every["checkpoint_every"], every["checkpoint_minutes"])
        backend = resolve_device(device)
        model = KSparseAutoencoder.load(folder.checkpoint, device=backend.name)
        folder.check_checkpoint(model.run_id_, model.trainer_.config.to_dict())  # this folder's run, not a copy
        model.run_id_ = folder.run_id
        trainer = model.trainer_
        resuming.check_refused(ctx, typed, trainer.config)
        changes = resuming.apply_options(ctx, typed, trainer)
        model.epochs, model.topk = trainer.config.epochs, trainer.config.topk
        say(resuming.where_line(folder.path, trainer.epoch, trainer.batch_in_epoch, trainer.step)
            + (f"; applied: {', '.join(changes)}" if changes else ""))
        record = dataset_record(dataset)
    else:
        if dataset is None:
            raise KsaeError("missing DATASET; give a dataset name or file, or --resume RUN_DIR")
        if no_k_schedule and k_start is not None:
            raise KsaeError(f"--k-start {k_start} contradicts --no-k-schedule (which trains with k from the first "
                            f"epoch); give one")
        spec = data_spec(dataset, **data_given)
        lr = parse_lr(lr, default="auto" if spec.is_user_file or dataset in AUTO_LR_DATASETS else 0.01)
        config = TrainConfig(hidden=hidden, k=k, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                             sigma=sigma, topk=topk, seed=seed, dtype=dtype, activation=activation, step=step,
                             aux_k=aux_k, aux_coef=aux_coef, dead_window=dead_window, center_input=center_input,
                             k_start=None if no_k_schedule else resolve_k_start(k_start if k_start is not None else "auto", k, hidden))
        config.validate()
        check_progress_seconds(progress_seconds)
        policy = CheckpointPolicy(checkpoint_every, checkpoint_minutes)
        every = resuming.run_level(ctx, typed, {})
        folder = RunFolder(run_dir or default_run_dir(dataset, hidden, k))
        folder.check_new(overwrite)
        record = dataset_record(spec.data)
        backend = resolve_device(device)
        model = None
    if spec.is_user_file:
        record["data"] = spec.record()  # labels and splits, for ksae-eval and --resume

    say(backend.description)
    threads_line, threads_used = set_blas_threads(threads)
    say(threads_line)
    # The count used is the run's from now on: a resume keeps it, since BLAS products differ in
    # their last bits on another thread count (the CPU kernels do not).
    every["threads"] = threads_used
    data = load_dataset(spec, root=data_dir, log=lambda msg: say(msg, err=True))
    say(data.summary() + (f"; labels: {data.n_classes} classes" if data.y_train is not None else ""))
    if model is None:
        if config.k_start is not None and not schedule_reaches_k(config.epochs, config.k, config.k_start):
            say(f"note: in {config.epochs} epoch the k schedule would stay at k-start {config.k_start} and never "
                f"reach k {config.k}; training with k {config.k} from the start (as --no-k-schedule)")
            config.k_start = None
        model = KSparseAutoencoder(n_hidden=config.hidden, k=config.k, k_start=config.k_start, epochs=config.epochs,
                                   batch_size=config.batch_size, lr=config.lr, momentum=config.momentum,
                                   sigma=config.sigma, topk=config.topk, seed=config.seed, dtype=config.dtype,
                                   device=backend.name, activation=config.activation, step=config.step,
                                   aux_k=config.aux_k, aux_coef=config.aux_coef, dead_window=config.dead_window,
                                   center_input=config.center_input)
        X_fit = model.training_rows(data.X_train)  # what fit trains on (--center-input: minus their mean)
        resolved_config = model.config(X_fit)  # --lr auto: the rate derived from the training rows
        resolved_config.validate(n_train=len(data.X_train))
        if resolved_config.lr_auto:
            say(f"--lr auto: {resolved_config.lr} for this data ({describe_auto_lr(X_fit)})")
        check_training_memory(backend, data.dim, config.hidden, config.batch_size, config.dtype)
        from ksae_cupy.training.learning_rate import check_data_scale, check_rate_moves_weights
        from ksae_cupy.training.trainer import Trainer

        # fit checks them too, but only after the run folder is made: say it before anything is written
        check_data_scale(X_fit, resolved_config, "--lr")
        check_rate_moves_weights(Trainer(resolved_config, backend, D=data.dim), X_fit, "--lr")
        model.preprocess_ = dict(data.preprocess)
    elif model.trainer_.params["W_dh"].shape[0] != data.dim:
        raise KsaeError(f"the checkpoint's model takes {model.trainer_.params['W_dh'].shape[0]} dimensions, "
                        f"{dataset} has {data.dim}")

    ctx.call_on_close(folder.release)
    folder.create(log=lambda msg: say(msg, err=True), new=resume is None, overwrite=overwrite)
    model.run_id_ = folder.run_id  # every checkpoint carries the folder's identity
    if model.trainer_ is not None:
        dropped = folder.drop_metrics_after(model.trainer_.step, model.trainer_.epoch, model.trainer_.config.epochs)
        if dropped:
            say(dropped)
    resolved = {**record, "train": resolved_config.to_dict()
                if model.trainer_ is None else model.trainer_.config.to_dict(),
                **every, "device": backend.name, "data_dir": str(data_dir) if data_dir else None,
                "run_dir": str(folder.path)}
    folder.write_config(resolved)
    say("config: " + json.dumps(resolved["train"], sort_keys=True))
    say(f"run folder: {folder.path}")
    minutes = f" and every {policy.seconds / 60:g} minutes" if policy.seconds else ""
    say(f"checkpoints: {folder.checkpoint}, every {policy.every_epochs} epochs{minutes}, and at the end")

    progress = None

    def show():
        nonlocal progress
        if progress is None:  # the trainer exists once fit has started
            trainer, sample_nd = model.trainer_, data.X_train[:model.trainer_.config.batch_size]
            # Compile the validation pass's kernels now, before the progress clock starts: the
            # estimate printed after epoch 1 is then the run's pace, not the compiler's.
            trainer.evaluate_loss(trainer.backend.asarray(sample_nd))
            progress = RunProgress(trainer, len(data.X_train), enabled=not quiet, tty=sys.stderr.isatty(),
                                   interval_s=progress_seconds,
                                   step_cost=lambda k: trainer.step_seconds(trainer.backend.asarray(sample_nd), k))
        return progress

    def on_batch(done, total):
        show().on_batch(done, total)
        if policy.after_batch(done, total):
            model.save(folder.checkpoint)

    def on_epoch(report):
        folder.append_metrics(report)
        for line in show().after_epoch(report):
            say(line)

    finished_before = model.trainer_ is not None and model.trainer_.finished
    stop = StopOnSignals(model, say)
    started = time.perf_counter()
    try:
        model.fit(data.X_train, X_valid=data.X_valid, on_epoch=on_epoch, on_batch=on_batch,
                  checkpoint_path=folder.checkpoint, should_checkpoint=policy.after_epoch, option_names=cli_name)
    except CheckpointWriteError as exc:  # what to do next depends on whether a checkpoint is there to resume
        raise exc.advise(f"continue the run with: ksae-train --resume {folder.path}" if exc.kept else
                         f"start the run again with --overwrite (no checkpoint was written to resume from)") from None
    finally:
        stop.restore()
        if progress is not None:
            progress.clear()
    trainer = model.trainer_
    if not trainer.finished:
        click.echo(f"interrupted {resuming.position(trainer.epoch, trainer.batch_in_epoch)}; checkpoint saved to "
                   f"{folder.checkpoint}; continue with: ksae-train --resume {folder.path}", err=True)
        sys.exit(stop.exit_status)
    if finished_before:  # "done: 3 epochs in 0.0 s" read as if it had trained them
        click.echo(f"nothing to train: the run had already trained all its {trainer.epoch} epochs (options given are "
                   f"recorded); to train longer, give --epochs N with N > {trainer.epoch}")
        return
    click.echo(f"done: {resuming.epochs_done(trainer.epoch)} in {time.perf_counter() - started:.1f} s; "
               f"checkpoint {folder.checkpoint}")


def check_progress_seconds(seconds: float) -> None:
    if not seconds >= 0:  # NaN too
        raise KsaeError(f"--progress-seconds {seconds} is not allowed; use seconds >= 0 (0: a line every batch)")
