"""Many ``ksae-train`` runs in one launch, each in its own run folder.

    outcomes = train_packed(configs, data, backend, folders, dataset="mnist")

Every configuration is one run in its folder, opened, locked and written by a ``ksae-train`` run's own
lifecycle (:class:`~ksae_cupy.session.lifecycle.RunLifecycle`, one per run: config.json, metrics.jsonl, the
checkpoint policy), its trainer built and its checkpoint.h5 saved by a ``ksae-train`` run's own job
(:mod:`ksae_cupy.session.train_run`: ``new_job`` for a new run, ``resumed_trainer`` and ``TrainJob.resumed``
for a resumed one), so each one is an ordinary run afterwards: ``ksae-train --resume FOLDER`` continues it
alone, ``ksae-eval FOLDER`` scores it. A folder that already holds a checkpoint is resumed (its
configuration must be the one asked, the epochs aside, which apply as ``--epochs`` does on
``--resume``); a finished one trains nothing. The runs then train together (:class:`~ksae_cupy.training.packed.Pack`):
on the CPU one after another, bit for bit the runs alone; on a GPU as stacked models, one stack per
input width, hidden size, dtype, top-k and activation.

A run that diverges stops with its last good checkpoint (its outcome says why); the others go on.
A first Ctrl-C, SIGTERM or SIGHUP stops every run after the current step, each saving its checkpoint
(mid-epoch if need be), and raises :class:`PackStopped`; the same call again continues them.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ksae_cupy.datasets.preprocess import INPUT_MEAN
from ksae_cupy.errors import KsaeError, TrainingDiverged
from ksae_cupy.session.fields import RUN_LEVEL, TrainOptions
from ksae_cupy.session.lifecycle import RunLifecycle
from ksae_cupy.training.packed import Pack, stack_key
from ksae_cupy.session.runs import TRAIN, RunFolder, dataset_record
from ksae_cupy.session.stopping import StopOnSignals
from ksae_cupy.threads import estimator_threads

# Fields of a run's configuration a resumed folder may differ in from the one asked.
NOT_COMPARED = ("epochs", "k_schedule_epochs", "lr_auto", "lr")


@dataclass
class PackedOutcome:
    """One run of a pack: its folder, its job (ksae-train's :class:`~ksae_cupy.session.train_run.TrainJob`,
    trained: ``job.trainer()``, its validation rows ``job.X_valid_nd``), its last epoch's report (None when it
    trained no epoch in this launch), and why it stopped early (a divergence; None when it did not)."""

    folder: Path
    job: object
    report: object = None
    diverged: str | None = None


def train_packed(configs: list, data, backend, folders: list, *, dataset=None, settings: dict | None = None,
                 stacked: bool | None = None, restart_unstarted: bool = False, log=print) -> list[PackedOutcome]:
    """Train ``configs`` (:class:`~ksae_cupy.training.config.TrainConfig`, ``lr`` a number or ``"auto"``;
    each run trains a copy, the caller's left as given) on
    ``data`` (a loaded :class:`~ksae_cupy.datasets.Dataset`) on ``backend``, run ``i`` in ``folders[i]``
    (new, or resumed where it holds a checkpoint); one outcome per run, in order.

    ``dataset``: how config.json names the data (default ``data.name``): a built-in name, a user file, or its
    :class:`~ksae_cupy.datasets.user_files.DataSpec` (its labels and splits, as ``data`` was loaded with);
    ``settings``: the session settings config.json records (``checkpoint_every``, ``checkpoint_minutes``,
    ``threads``, ...; default ksae-train's);
    ``stacked``: :class:`Pack`'s (default: on a GPU); ``restart_unstarted``: a folder holding a run stopped before
    its first checkpoint (config.json, metrics, nothing to resume) starts again, its files replaced (a caller
    that owns its folders, as ``ksae-sweep`` its ``OUT/runs``; else such a folder is refused, as ``ksae-train``
    refuses it). ``log(line)`` gets one line per run's epoch.

    Each run's folder goes through its own :class:`~ksae_cupy.session.lifecycle.RunLifecycle`, as a
    ``ksae-train`` run's: opened (a resume: checked, locked, its data checked against the run's), then made,
    locked and its config.json written; its checkpoint policy and metrics. Its trainer is a ``ksae-train``
    run's job (:class:`~ksae_cupy.session.train_run.TrainJob`), built, checkpointed and its divergence retold by
    the functions ``ksae-train`` calls. The device, the CPU threads and the stop signals are the pack's, once
    for all its runs."""
    if len(configs) != len(folders):
        raise KsaeError(f"{len(configs)} configurations for {len(folders)} run folders; give one folder per run")
    paths = [Path(folder) for folder in folders]
    resolved = [p.resolve() for p in paths]  # one folder through a symlink or a relative path is one folder
    repeated = [(a, b) for i, a in enumerate(paths) for j, b in enumerate(paths) if i < j and resolved[i] == resolved[j]]
    if repeated:
        a, b = repeated[0]
        same = "is given" if a == b else f"(given also as {b}) is given"
        raise KsaeError(f"run folder {a} {same} to more than one run; give each run its own folder")
    # Every run's options: the pack's settings (ksae-train's defaults where not given), as if all were given
    # (one device and thread count for every run), and its configuration's --epochs (a resumed run applies them).
    options = TrainOptions(**{name: value for name, value in (settings or {}).items() if name in RUN_LEVEL},
                           given=frozenset(RUN_LEVEL) | {"epochs"})
    # Each run's own copy (validated or not, as given): a new run drops a schedule that never reaches k and
    # resolves --lr auto in its configuration; the caller's configurations stay as they were given.
    configs = [copy.copy(config) for config in configs]
    record = _data_record(dataset if dataset is not None else data.name)
    members = []
    try:
        # Everything checked and every model built before any folder is written.
        for config, path in zip(configs, paths):
            members.append(_open_member(config, data, backend, path, record, options, restart_unstarted, log))
        outcomes = [PackedOutcome(member.run.folder.path, member.job) for member in members]
        # The CPU threads of every run (BLAS's products differ in their last bits on another count: a run
        # resumed alone keeps the count recorded here).
        with estimator_threads(options.threads) as (count, _):
            for member in members:
                member.begin(record, backend, count)
            if members:
                log(_schedule_line(members[0].run.policy))
            packs = {}  # one pack per stack shape (on the CPU: one pack)
            for i, member in enumerate(members):
                key = stack_key(member.trainer.config, data.dim) if _stacks(backend, stacked) else None
                packs.setdefault(key, []).append(i)
            stop = StopOnSignals(lambda: running.get("pack"), lambda line, err=False: log(line.strip()),
                                 lambda line, err=False: log(line.strip()))
            running = {}
            try:
                for chosen in packs.values():
                    if stop.received is None:
                        _train_pack([members[i] for i in chosen], [outcomes[i] for i in chosen], stacked, log,
                                    running)
            finally:
                stop.restore()
    finally:
        for member in members:
            member.run.release()
    if stop.received is not None:
        raise PackStopped(stop.exit_status, [o.folder for o, m in zip(outcomes, members) if not m.trainer.finished])
    return outcomes


class PackStopped(KsaeError):
    """A stop signal (Ctrl-C, SIGTERM, SIGHUP) stopped the pack after a step; every run saved its checkpoint.
    ``status``: the exit status (128 + the signal); ``unfinished``: the folders of the runs not finished."""

    def __init__(self, status: int, unfinished: list):
        super().__init__(f"stopped: {len(unfinished)} run(s) saved unfinished; the same command again continues them")
        self.status, self.unfinished = status, unfinished


def _data_record(dataset) -> dict:
    """How config.json names the data, as ``ksae-train`` writes it: a built-in name; a user file by its path and
    SHA-256, with its labels and splits (``dataset`` a :class:`~ksae_cupy.datasets.user_files.DataSpec` for
    splits other than the defaults)."""
    from ksae_cupy.datasets.user_files import DataSpec
    from ksae_cupy.session.trained_on import data_files_record

    spec = dataset if isinstance(dataset, DataSpec) else DataSpec(str(dataset)).validate().resolved()
    record = dataset_record(spec.data)
    if spec.is_user_file:
        record["data"] = data_files_record(spec.record())
    return record


def _stacks(backend, stacked: bool | None) -> bool:
    return backend.is_gpu if stacked is None else stacked


class _PackedLifecycle(RunLifecycle):
    """A packed run's lifecycle: ksae-train's, but its configuration is in its config.json unsaid (the pack
    names each run's folder on each of its lines, and says the checkpoint schedule once for all)."""

    def announce(self, configuration: dict) -> None:
        pass


def _schedule_line(policy) -> str:
    minutes = f" and every {policy.seconds / 60:g} minutes" if policy.seconds else ""
    return f"checkpoints: in each run's folder, every {policy.every_epochs} epochs{minutes}, and at the end"


class _Member:
    """One run of the pack: its lifecycle (folder, settings, checkpoint policy), its job (ksae-train's
    :class:`~ksae_cupy.session.train_run.TrainJob`: trainer, host rows, checkpoints) and the data it was
    given (whose rows its job holds, centred as the run's are)."""

    def __init__(self, run: RunLifecycle, job, data):
        self.run, self.job, self.data = run, job, data
        self.step_before = job.trainer().step

    @property
    def trainer(self):
        return self.job.trainer()

    def begin(self, record: dict, backend, threads: int) -> None:
        """The run's folder made and locked, config.json written, as ``ksae-train`` does (the pack's device
        and thread count); its job then saves into it, the folder's identity in every checkpoint."""
        self.run.started(backend, threads)
        self.run.begin({**record, "train": self.trainer.config.to_dict()}, "train",
                       self.trainer if self.run.resuming else None)
        self.job.into(self.run, True, None)  # no progress: the pack says one line per run's epoch

    def save(self) -> None:
        self.job.save()


def _open_member(config, data, backend, path: Path, record: dict, options: TrainOptions, restart_unstarted: bool,
                 log) -> _Member:
    """The run in ``path`` opened by its lifecycle as ``ksae-train`` opens one, its job built by ksae-train's
    own functions (:mod:`ksae_cupy.session.train_run`): resumed from its checkpoint
    (:func:`~ksae_cupy.session.train_run.resumed_trainer`; its data the pack's, its configuration checked
    against ``config``, ``config``'s epochs applied as ``--epochs`` on ``--resume``), or new
    (:func:`~ksae_cupy.session.train_run.new_job`: the schedule and batch checks, --lr auto resolved and
    said, the checks before training)."""
    from ksae_cupy.session import resuming, train_run

    say = lambda line, err=False: log(f"{path}: {line}")  # noqa: E731
    folder = RunFolder(path, kind=TRAIN)
    resume = folder.checkpoint.is_file()
    restart = not resume and restart_unstarted and folder.folder_kind() in (None, TRAIN) and bool(folder.run_files())
    options = replace(options, dataset=record["dataset"], resume=path if resume else None, run_dir=path,
                      overwrite=restart, epochs=config.epochs)
    run = _PackedLifecycle("ksae-train", TRAIN, options, say)
    try:
        run.open(lambda: path)
        if restart:
            say("its run stopped before its first checkpoint; starting it again, its files replaced")
        if not resume:
            return _Member(run, train_run.new_job(config, data, backend, say), data)
        trainer, preprocess = train_run.resumed_trainer(run.folder, backend)
        saved = trainer.config.to_dict()
        asked = {**config.to_dict(), "k_start": train_run.asked_k_start(config.k_start, saved)}  # as ksae-train's
        differing = [f"{name} {saved[name]} (asked: {value})" for name, value in asked.items()
                     if name not in NOT_COMPARED and saved.get(name) != value]
        if config.lr != "auto" and config.lr != trainer.config.lr:
            differing.append(f"lr {trainer.config.lr} (asked: {config.lr})")
        if differing:
            raise KsaeError(f"run folder {path} holds another run: {', '.join(differing)}; give the run another "
                            f"folder, or remove that one")
        if trainer.params["W_dh"].shape[0] != data.dim:
            raise KsaeError(f"run folder {path}: its model takes {trainer.params['W_dh'].shape[0]} "
                            f"dimensions, the data has {data.dim}")
        resuming.apply(["epochs"], options, trainer)
    except BaseException:
        run.release()  # a resumed folder is locked from open on
        raise
    return _Member(run, train_run.TrainJob.resumed(trainer, preprocess, data), data)


def _train_pack(members: list, outcomes: list, stacked, log, running: dict) -> None:
    """Train ``members`` as one :class:`Pack` (``running["pack"]`` while it trains, for the stop signals):
    metrics and checkpoints into each one's folder."""
    from ksae_cupy.training.wording import epoch_line

    rows = _device_rows(members)
    pack = running["pack"] = Pack([member.trainer for member in members], stacked=stacked)
    for member in members:
        member.run.policy.restart()  # the minutes count from the first step, not from loading

    def on_epoch(i, report):
        member = members[i]
        member.run.append_metrics(report)  # before the checkpoint: a resume drops lines past it
        outcomes[i].report = report
        log(f"{member.run.folder.path.name}: {epoch_line(report, member.trainer.config.epochs)}")

    started = time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a divergence is said by its outcome
        pack.fit([train for train, _ in rows], [valid for _, valid in rows], on_epoch,
                 should_checkpoint=lambda i, epoch: members[i].run.policy.after_epoch(epoch),
                 checkpoint=lambda i: members[i].save())
    for i, member in enumerate(members):
        if i not in pack.failed and member.run.needs_final_save(member.trainer, member.step_before):
            try:  # stopped mid-epoch, a stacked run's divergence may not have been seen yet: the save refuses it
                member.save()
            except TrainingDiverged as exc:
                pack.failed[i] = exc
        if i in pack.failed:
            outcomes[i].diverged = str(member.job.retold(pack.failed[i]))  # as ksae-train retells it
            log(f"{member.run.folder.path.name}: diverged: {outcomes[i].diverged}")
    how = "as one stacked model" if pack.stacked else "one after another"
    log(f"pack of {len(members)} run(s), {how}: {time.perf_counter() - started:.1f} s")


def _device_rows(members: list) -> list:
    """Each member's training and validation rows on the device, as its job's fit puts them there (its host
    rows, centred as the run's are); members whose rows are the same data's, centred by the same mean, in
    the same dtype, share one device copy."""
    copies, rows = {}, []
    for member in members:
        job, mean = member.job, member.job.preprocess.get(INPUT_MEAN)
        pair = []
        for source, X_nd in ((member.data.X_train, job.X_nd), (member.data.X_valid, job.X_valid_nd)):
            if X_nd is None:
                pair.append(None)
                continue
            key = (id(source), None if mean is None else mean.tobytes(), member.trainer.dtype.str)
            if key not in copies:
                copies[key] = job.on_device(X_nd)
            pair.append(copies[key])
        rows.append(tuple(pair))
    return rows
