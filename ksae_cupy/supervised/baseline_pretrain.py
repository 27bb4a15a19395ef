"""``ksae-finetune --baseline``'s pretraining, as run folders inside the fine-tuning run's folder.

Layer l is a ``ksae-baseline`` run folder ``RUN/pretrain-layer<l>`` (lock, ``config.json``,
``metrics.jsonl``, ``checkpoint.h5``), trained by the loop ``ksae-baseline`` runs under the
fine-tuning session's checkpoint policy and stop signals. A stop saves the layer's checkpoint and
says ``continue with: ksae-finetune --resume RUN``; that resume continues the layer bit for bit,
skips the layers already done and then fine-tunes, so the run ends as if it had never stopped.
Layer l+1 learns on layer l's features of the training rows (every sigmoid unit of the uncorrupted
input, section 4.6), computed again from layer l's checkpoint on a resume.

Layer 1's folder names the fine-tuning run's data, so ``ksae-eval RUN/pretrain-layer1`` evaluates it
as any ``ksae-baseline`` run; the stack can also be fine-tuned again by ``ksae-finetune
RUN/pretrain-layer1 RUN/pretrain-layer2``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError
from ksae_cupy.supervised import baseline_run
from ksae_cupy.supervised import baseline_trainer as bt
from ksae_cupy.supervised.baselines import encode
from ksae_cupy.session.progress import RunProgress
from ksae_cupy.session.runs import PRETRAIN_LAYER, RunFolder, data_record
from ksae_cupy.training.wording import interrupted, position


def still_pretraining(run_dir) -> bool:
    """Whether the ``ksae-finetune`` run at ``run_dir`` is a ``--baseline`` run stopped before fine-tuning
    began (config.json written, no fine-tuning checkpoint yet): its resume goes on pretraining."""
    from ksae_cupy.session.runs import FINETUNE

    folder = RunFolder(Path(run_dir), kind=FINETUNE)
    config = folder.folder_config()
    return (not folder.checkpoint.is_file() and config.get("kind") == FINETUNE
            and config.get("pretrain_layers") is not None)


def layer_folder(run_path: Path, layer: int) -> RunFolder:
    """Layer ``layer``'s (1-based) ``ksae-baseline`` run folder inside the fine-tuning run at ``run_path``."""
    return RunFolder(Path(run_path) / PRETRAIN_LAYER.format(layer), kind=bt.KIND)


def pretrain_layers(run, configs: list, spec, data, say) -> list[dict]:
    """Train (or resume, or skip when done) each layer of ``configs`` in its folder under ``run``
    (a :class:`~ksae_cupy.session.lifecycle.RunLifecycle` whose folder exists); host parameters per
    layer. A stop signal saves the layer's checkpoint, says how to resume the run and exits with the
    signal's status. ``spec`` names the data in layer 1's config.json."""
    backend = run.backend
    with backend.use():
        X_train = backend.asarray(data.X_train, dtype=np.dtype(configs[0].dtype))
        X_valid = None if data.X_valid is None else backend.asarray(data.X_valid, dtype=X_train.dtype)
    stack = []
    for layer, config in enumerate(configs, start=1):
        folder = layer_folder(run.folder.path, layer)
        trainer = _layer_trainer(folder, config, X_train.shape[1], backend, run, layer)
        record = {**(data_record(spec) if layer == 1 else
                     {"dataset": None, "input": f"the features of {layer_folder(run.folder.path, layer - 1).path}"}),
                  "model": bt.model_name(config), "baseline": bt.config_to_dict(trainer.config),
                  **run.settings, "device": backend.name, "run_dir": str(folder.path)}
        folder.write_config(record)
        trainer.run_id = folder.run_id
        if trainer.finished:
            say(f"pretraining layer {layer}: done earlier ({trainer.epoch} epochs), {folder.path}")
        else:
            say(f"pretraining layer {layer} ({record['model']}, {config.hidden} units, {config.epochs} epochs): "
                f"run folder {folder.path}")
            layer_run = run.nested(folder)
            progress = RunProgress(baseline_run.progress_view(trainer), X_train.shape[0],
                                   enabled=not run.options.quiet, tty=sys.stderr.isatty(),
                                   interval_s=run.settings["progress_seconds"], echo=run.echo)
            # ksae-baseline's job, its lines (ETA included) naming the layer
            layer_run.fit(baseline_run.BaselineJob(trainer, X_train, X_valid, folder.checkpoint, progress,
                                                   prefix=f"pretrain layer {layer} "))
            if trainer.stop_requested:  # a stop signal: the session ends here, even after the layer's last epoch
                at = position(trainer.epoch, trainer.batch_in_epoch)
                run.echo(interrupted(f"in pretraining layer {layer}, {at}", folder.checkpoint, run.command,
                                     run.folder.path), err=True)
                sys.exit(layer_run.stop.exit_status)
        stack.append(trainer.host_params())
        with backend.use():  # the next layer's rows: this layer's features of the uncorrupted input
            X_train = encode(trainer.params, X_train)
            X_valid = None if X_valid is None else encode(trainer.params, X_valid)
        folder.release()
    return stack


def _layer_trainer(folder: RunFolder, config, D: int, backend, run, layer: int):
    """The layer's trainer: on a resume, from the layer's checkpoint when it has one (which must be this
    layer's run and settings); else new, its folder made (a new run's with --overwrite emptied of an
    earlier run's files; a resumed run's layer without a checkpoint has nothing to keep)."""
    if run.resuming and folder.checkpoint.is_file():
        trainer = bt.BaselineTrainer.load(folder.checkpoint, backend)
        folder.check_checkpoint(trainer.run_id)  # this folder's run, not a copy
        saved, planned = bt.config_to_dict(trainer.config), bt.config_to_dict(config)
        if saved != planned:
            differing = ", ".join(f"{key} {saved.get(key)} (config.json: {planned.get(key)})"
                                  for key in sorted(set(saved) | set(planned)) if saved.get(key) != planned.get(key))
            raise KsaeError(f"{folder.checkpoint} is not the layer this run pretrains: {differing}; put the run's own "
                            f"layer back, or start the run again with --overwrite")
        folder.lock(log=run.log)
        dropped = folder.drop_metrics_after(trainer.step, trainer.epoch, trainer.config.epochs)
        if dropped:
            run.say(f"pretraining layer {layer}: {dropped}")
        return trainer
    overwrite = run.resuming or run.options.overwrite
    if folder.run_files() and not overwrite:  # said before the lock is taken: a refusal leaves none held
        raise KsaeError(f"{folder.path} holds an earlier run's pretraining ({', '.join(folder.run_files())}); "
                        f"discard it with --overwrite, or choose another --run-dir")
    folder.create(log=run.log, new=True, overwrite=overwrite)
    return bt.BaselineTrainer(config, backend, D)
