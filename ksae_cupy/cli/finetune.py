"""``ksae-finetune``: supervised fine-tuning of one or two pretrained k-sparse autoencoders.

    ksae-finetune runs/mnist-h1000-k25-A --alpha 3 --epochs 200            # shallow (section 4.5)
    ksae-finetune runs/A runs/B --alpha 3 --epochs 200                      # deep, layer-wise (4.6)
    ksae-finetune mnist --no-pretraining --hidden 1000 --k 25               # baseline, random init
    ksae-finetune mnist --baseline dropout-ae --hidden 1000,1000            # baseline pretrained here
    ksae-finetune --resume runs/finetune-mnist-...

``--baseline NAME`` pretrains that learner of :data:`ksae_cupy.supervised.baselines.BASELINES` (one layer per ``--hidden`` size, ``--pretrain-epochs`` each) on
the training set, each layer a ``ksae-baseline`` run folder inside the run's (``RUN/pretrain-layer1``,
...: :mod:`ksae_cupy.supervised.baseline_pretrain`), then fine-tunes its sigmoid layers with the same
dropout (section 4.5). A stop during the pretraining saves the layer's checkpoint, and ``--resume RUN``
goes on from there, bit for bit.

``--step auto|dense|sparse`` picks the training step: sparse (only layer 1's ``X W1`` dense, every
later product through the kept units; :mod:`ksae_cupy.supervised.sparse_finetune`) for k-sparse
nets without dropout on the CPU, which ``auto`` takes; dense otherwise. The same math, so it may be
given on ``--resume``, as may ``--threads`` (BLAS and CPU kernel threads; a resumed run keeps the
count it was started with unless told, since BLAS results differ in their last bits between counts).

The run folder holds ``checkpoint.h5`` (a fine-tuning checkpoint), ``config.json`` (with each
pretrained run's epochs when it was read, a baseline's pretraining seconds per layer and the step
taken), ``metrics.jsonl`` and, at the end, ``finetune.json`` with the validation and test error.
Bad input is one line ``error: ...`` and exit status 2 (see :func:`ksae_cupy.cli.common.report_errors`).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from ksae_cupy.cli.version import version_option
from ksae_cupy.cli.common import GivenPath, data_options, report_errors
from ksae_cupy.cli.options import CONTEXT, declared, run_of, typed
from ksae_cupy.supervised.baseline_pretrain import still_pretraining
from ksae_cupy.supervised.commands import FINETUNE, FinetuneOptions
from ksae_cupy.supervised.finetune import FinetuneConfig
from ksae_cupy.supervised.finetune_progress import PhasePace, PhaseProgress
from ksae_cupy.supervised.finetune_run import RESULTS


@click.command(context_settings=CONTEXT)
@version_option
@click.argument("pretrained", nargs=-1, type=GivenPath(path_type=Path), metavar="[DATASET] [PRETRAINED_RUN_DIR]...")
@declared(FINETUNE)
@data_options
@report_errors
@typed(FinetuneOptions)
def finetune_command(ctx, options: FinetuneOptions, pretrained):
    """Fine-tune a softmax network initialised from PRETRAINED_RUN_DIR [PRETRAINED_RUN_DIR_2]
    (ksae-train or ksae-baseline runs).

    DATASET (a built-in name or your file, as ksae-train takes it) is the pretrained run's when not
    given; with --no-pretraining or --baseline it is required. --dataset is its old spelling.
    """
    from ksae_cupy.supervised import finetune_run as ft
    from ksae_cupy.session.trained_on import data_files_record
    from ksae_cupy.session.runs import FINETUNE as KIND, dataset_record

    ft.check_step(options.step)
    pretrained, dataset = ft.split_arguments(pretrained, options.dataset)
    if dataset is not None:  # DATASET as an argument: given, as --dataset is
        options = dataclasses.replace(options, given=options.given | {"dataset"})
    run = run_of(ctx, "ksae-finetune", KIND, options)
    say = run.say
    if run.resuming:
        ft.refuse_on_resume(options, pretrained)
        pretraining = still_pretraining(options.resume)  # stopped before fine-tuning began: no checkpoint yet
        previous = run.open(needs_checkpoint=not pretraining)
        backend = run.start()
        trainer = None if pretraining else ft.resumed_trainer(run.folder, backend, options)
        record = {key: value for key, value in previous.items() if key not in ("run_id", "kind")}
        spec = run.spec
        dataset = spec.data
        data = run.load(spec)
    else:
        ft.check_new(options, pretrained)
        run.open()
        run.start()  # the threads before the pretraining, which runs here too
        read = ft.read_pretrained(pretrained, options.alpha)
        ft.check_alpha_applies(options, read[1])
        spec = ft.data_of(dataset, read[2], options)
        dataset = spec.data
        run.new_folder(lambda: ft.default_run_dir(dataset))
        data = run.load(spec)
        trainer, record = ft.new_trainer(options, pretrained, read, data, run.backend)
        record.update({**dataset_record(spec.data), "data": data_files_record(spec.record())})  # SHA-256s: --resume checks them
    backend = run.backend
    if trainer is None:  # --baseline before its fine-tuning: on a resume, --step and --topk apply as to a checkpoint
        config = FinetuneConfig.from_dict({**record["finetune"], **(ft.applied(options) if run.resuming else {})})
    else:
        config = trainer.config
    step_kind = config.resolved_step(backend)
    say(backend.description)
    say(run.threads_line)
    say(f"step: {step_kind} (--step {config.step})")
    say(data.summary())
    record.update({"finetune": config.to_dict(), "step_kind": step_kind})
    run.begin(record, "finetune", trainer)
    if trainer is None:  # --baseline: its layers first, each a run folder in this one (a stop keeps them)
        trainer = ft.baseline_trainer(run, record, spec, data, say)
    rows = ft.training_rows(data, trainer.config)
    if trainer.config.fits_valid_rows:
        say(f"fine-tuning on train+valid: {len(rows[0])} rows; no validation error (--train-on)")
    X_train, y_train, X_valid, y_valid = (None if a is None else backend.asarray(a, dtype=t) for a, t in
                                          zip(rows, (trainer.dtype, "int64", trainer.dtype, "int64")))
    pace = PhasePace(trainer.config.phases, trainer.config.epochs)
    progress = PhaseProgress(trainer, pace, len(rows[0]), enabled=not options.quiet, tty=sys.stderr.isatty(),
                             interval_s=run.settings["progress_seconds"], echo=click.echo)
    run.fit(ft.FinetuneJob(trainer, (X_train, y_train, X_valid, y_valid), run.folder, pace, progress))
    run.end(trainer, None, where=lambda t: f"in phase {t.phase}, epoch {t.epoch + 1}")
    results = ft.write_results(run.folder, trainer, data, dataset, backend, run.started)
    errors = [f"{name} error {100 * results[f'{name}_error']:.2f}%" for name in ("valid", "test")
              if results[f"{name}_error"] is not None]
    click.echo(f"done: {', '.join(errors) or 'fine-tuned'}; results {run.folder.path / RESULTS}")
