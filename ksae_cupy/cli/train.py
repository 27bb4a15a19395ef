"""``ksae-train``: train a k-sparse autoencoder on a dataset, with checkpoints and resume.

Thin by design: the options are declared in :mod:`ksae_cupy.session.fields`, the run's session is
:class:`~ksae_cupy.session.lifecycle.RunLifecycle`, the job (its trainer, built directly, not through the
scikit-learn estimator) :mod:`ksae_cupy.session.train_run`'s.
"""
from __future__ import annotations

import click

from ksae_cupy.cli.common import data_spec
from ksae_cupy.cli.options import dataset_command, run_of
from ksae_cupy.errors import KsaeError
from ksae_cupy.session.fields import TrainOptions, default_lr, parse_lr
from ksae_cupy.training.options import check_seed
from ksae_cupy.training.wording import dead_units_note, done_dead


@dataset_command(TrainOptions)
def train_command(ctx, options: TrainOptions):
    """Train a k-sparse autoencoder on DATASET.

    DATASET is a built-in name ({datasets}: `ksae-data list` tells more)
    or your own data: an .npz holding X (N x D) and, optionally, y, X_test and
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
    from ksae_cupy.session import train_run
    from ksae_cupy.session.trained_on import data_files_record
    from ksae_cupy.session.runs import TRAIN as KIND, dataset_record, default_run_dir

    dataset = options.dataset
    run = run_of(ctx, "ksae-train", KIND, options)
    say = run.say
    check_seed("--seed", options.seed)  # paths are checked by RunFolder, memory once the data's width is known
    if run.resuming:
        run.open()
        spec, backend = run.spec, run.start()
        dataset = spec.data
        trainer, preprocess, changes = train_run.resumed_job(run.folder, backend, options)
        say(run.where(trainer, changes))
    else:
        if dataset is None:
            raise KsaeError("missing DATASET; give a dataset name or file, or --resume RUN_DIR")
        spec = data_spec(dataset, options)
        lr = parse_lr(options.lr, default=default_lr(dataset))
        config = train_run.new_config(options, lr)
        run.open(lambda: default_run_dir(dataset, config.hidden, config.k))
        backend, trainer = run.start(), None
    record = dataset_record(spec.data)  # a user file by absolute path and SHA-256 (a resume: the run's, checked)
    if spec.is_user_file:
        record["data"] = data_files_record(spec.record())  # labels and splits (files hashed), for ksae-eval and --resume
    say(backend.description)
    say(run.threads_line)
    data = run.load(spec)
    say(data.summary() + (f"; labels: {data.n_classes} classes" if data.y_train is not None else ""))
    if spec.is_user_file and data.y_train is not None and data.X_test is None and not run.resuming:
        say(no_test_set_note(dataset))  # labelled rows without a test set: ksae-eval will ask for one
    if trainer is None:
        job = train_run.new_job(config, data, backend, say)
    elif trainer.params["W_dh"].shape[0] != data.dim:
        raise KsaeError(f"the checkpoint's model takes {trainer.params['W_dh'].shape[0]} dimensions, "
                        f"{dataset} has {data.dim}")
    else:
        job = train_run.TrainJob.resumed(trainer, preprocess, data)
    run.begin({**record, "train": job.trainer().config.to_dict()}, "train", trainer)
    job.into(run, options.quiet, click.echo)  # every checkpoint carries the folder's identity
    run.fit(job)
    trainer = job.trainer()
    n_dead = final_dead_count(run, trainer, job, data)
    config = trainer.config
    note = dead_units_note(n_dead, config.hidden, config.aux_k, config.center_input)
    if note and trainer.finished and not run.finished_before:  # said just before the done line
        click.echo(note)
    run.end(trainer, "done: {epochs} in {seconds:.1f} s" + done_dead(n_dead, config.hidden).replace("{", "{{")
            .replace("}", "}}") + "; checkpoint {checkpoint}")


def no_test_set_note(dataset) -> str:
    """What a run of the user's file without a test set says at its start: ksae-eval will need one, and how."""
    return (f"note: {dataset} has no test set (no X_test, --test or --test-fraction): ksae-eval will need one. "
            f"Give it later as ksae-eval RUN_DIR --test FILE [--test-labels FILE], or hold rows out now: stop and "
            f"train again with --test-fraction 0.1 (rows the autoencoder trained on would not test it fairly)")


def final_dead_count(run, trainer, job, data) -> int | None:
    """The dead units of the final weights on the training rows, kept in ``RUN_DIR/units.json`` with every unit's
    firing count (what ksae-eval, ksae-plot and the export report); None where the trainer holds a block of the
    units only (MPI)."""
    from ksae_cupy.training.unit_counts import measure, write_unit_counts

    if not trainer.finished or not getattr(trainer, "tracks_dead_units", True):
        return None
    counts = measure(trainer, job.preprocess, data.X_train)
    write_unit_counts(run.folder.path, counts)
    return counts["n_dead"]
