"""``ksae-baseline``: train one of the paper's baseline learners as a run folder, with resume.

    ksae-baseline mnist --model dropout-ae --epochs 500 --threads 1 --run-dir runs/dropout-ae
    ksae-baseline --resume runs/dropout-ae                 # after a stop, a crash or kill -9
    ksae-eval runs/dropout-ae                              # the features' classifier, as for k-sparse runs

The models are the registry's, :data:`ksae_cupy.supervised.baselines.BASELINES` (``--model``'s choices and help
read it), trained by :class:`~ksae_cupy.supervised.baseline_trainer.BaselineTrainer`.
The run folder is a ``ksae-train`` one (:class:`~ksae_cupy.session.runs.RunFolder`: lock,
``config.json``, ``metrics.jsonl``, ``checkpoint.h5``) and the run has what a ``ksae-train`` run has,
from the same pieces: checkpoints every N epochs and M minutes (mid-epoch if need be), a progress
line with the ETA, Ctrl-C / SIGTERM / SIGHUP save and print the command that continues, and
``--resume`` continues bit for bit (options that shape the run are refused, ``--epochs`` may grow).
"""
from __future__ import annotations

import sys

import click

from ksae_cupy.cli.common import data_spec
from ksae_cupy.cli.options import dataset_command, run_of
from ksae_cupy.errors import KsaeError
from ksae_cupy.supervised.baseline_run import default_run_dir
from ksae_cupy.supervised.baseline_trainer import KIND  # the run folders' kind
from ksae_cupy.supervised.commands import BaselineOptions
from ksae_cupy.training.options import check_seed


@dataset_command(BaselineOptions)
def baseline_command(ctx, options: BaselineOptions):
    """Train a baseline learner of the paper ({baselines}) on DATASET.

    DATASET is what ksae-train takes (a built-in name or your file, with the same data options).
    Evaluate the run folder with ksae-eval, as a k-sparse run: logistic regression on the
    features of the uncorrupted input with every hidden unit (section 5).

    \b
    Examples:
      ksae-baseline mnist --model rbm --epochs 500 --threads 1
      ksae-baseline --resume runs/mnist-rbm-h1000-20261125-160500
    """
    from ksae_cupy.session.progress import RunProgress
    from ksae_cupy.supervised import baseline_run
    from ksae_cupy.supervised import baseline_trainer as bt
    from ksae_cupy.session.runs import data_record

    dataset = options.dataset
    run = run_of(ctx, "ksae-baseline", KIND, options)
    say = run.say
    check_seed("--seed", options.seed)
    if run.resuming:
        baseline_run.check_resumable(run.open(), options.resume)
        spec = run.spec
        dataset = spec.data
        trainer, changes = baseline_run.resumed_trainer(run.folder, run.start(), options)
        say(run.where(trainer, changes))
        config = trainer.config
    else:
        if dataset is None:
            raise KsaeError("missing DATASET; give a dataset name or file, or --resume RUN_DIR")
        spec, config = data_spec(dataset, options), baseline_run.new_config(options)
        run.open(lambda: default_run_dir(dataset, options.model, options.hidden))
        run.start()
        trainer = None
    record = data_record(spec)
    backend = run.backend
    say(backend.description)
    say(run.threads_line)
    data = run.load(spec)
    say(data.summary())
    baseline_run.check_input(config, data, dataset, trainer)
    trainer = trainer or baseline_run.new_trainer(config, data, backend)
    # "baseline", not "train": the learner's options are not a ksae-train run's (which reads "train")
    run.begin({**record, "model": bt.model_name(config), "baseline": bt.config_to_dict(trainer.config)}, "baseline",
              trainer)
    trainer.run_id = run.folder.run_id  # every checkpoint carries the folder's identity
    with backend.use():
        X_train = backend.asarray(data.X_train, dtype=trainer.dtype)
        X_valid = backend.asarray(data.X_valid, dtype=trainer.dtype) if data.X_valid is not None else None
    progress = RunProgress(baseline_run.progress_view(trainer), len(data.X_train), enabled=not options.quiet,
                           tty=sys.stderr.isatty(), interval_s=run.settings["progress_seconds"], echo=click.echo)
    run.fit(baseline_run.BaselineJob(trainer, X_train, X_valid, run.folder.checkpoint, progress))
    run.end(trainer, "done: {epochs} in {seconds:.1f} s; checkpoint {checkpoint}; evaluate with: ksae-eval {run}")
