"""One session of a training run, the same for every command (ksae-train, ksae-baseline, ksae-finetune).

    run = RunLifecycle("ksae-train", TRAIN, options, echo)   # options: a TrainOptions (session/fields.py)
    run.open(default_dir)                 # --resume: check, lock, read the run and its data (run.spec);
                                          #   a new run: check its folder; then the session's settings
    backend = run.start()                 # the device and the CPU threads: as given, else the run's
    data = run.load(spec)
    run.begin(record, "train", trainer)   # folder, identity, config.json, and the lines that say where
    run.fit(job)                          # the job (a RunJob) under the checkpoint policy, stop signals, metrics
    run.end(trainer, done_line)           # "done", "nothing to train" or "interrupted ... continue with"

Settings of the session (:data:`~ksae_cupy.session.fields.RUN_LEVEL`: device, threads, data root,
checkpoint schedule, progress interval) are the options given, else on --resume the run's own
(config.json), else the defaults, and are recorded in config.json. A first Ctrl-C, SIGTERM or
SIGHUP finishes the current step, saves and exits with 128 + the signal (130, 143, 129); the
same signal again stops at once without saving.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from ksae_cupy.errors import KsaeError, note
from ksae_cupy.session import resuming
from ksae_cupy.training.checkpoint import CheckpointWriteError
from ksae_cupy.session.checkpoint_policy import CheckpointPolicy
from ksae_cupy.session.fields import RUN_LEVEL
from ksae_cupy.session.trained_on import check_data_files
from ksae_cupy.session.runs import RunFolder
from ksae_cupy.session.stopping import StopOnSignals
from ksae_cupy.training.wording import epochs_done, interrupted, nothing_to_train, position


class RunLifecycle:
    """``command`` (how the lines name it) writes run folders of ``kind``; ``options`` are its values (``given``:
    those typed); ``echo(message, err=False)`` prints (``say`` is silent with --quiet)."""

    # The session's settings kept in config.json (those of them the command offers: a name not among
    # ``options``' fields is left out); a command with settings of its own adds them (the MPI trainer's --comm).
    run_level = RUN_LEVEL

    def __init__(self, command: str, kind: str, options, echo):
        self.command, self.kind, self.options, self.echo = command, kind, options, echo
        self.say = (lambda *a, **kw: None) if options.quiet else echo
        self.folder: RunFolder | None = None
        self.previous: dict | None = None
        self.settings: dict = {}
        self.stop = None

    @property
    def resuming(self) -> bool:
        return self.options.resume is not None

    def log(self, message: str) -> None:
        self.say(message, err=True)

    # -- before any work ---------------------------------------------------------------------
    def open(self, default_dir=None, needs_checkpoint: bool = True) -> dict | None:
        """--resume: the run's folder checked (holding a checkpoint unless ``needs_checkpoint`` is False), locked (until the process ends or :meth:`release`), its
        data checked (:attr:`spec`) and its config.json returned. A new run: its folder checked (made and
        locked by :meth:`begin`) when ``default_dir`` is given, else by :meth:`new_folder` later. Then the
        session's settings (:attr:`settings`) and checkpoint policy (:attr:`policy`)."""
        options = self.options
        if self.resuming:
            resume = options.resume
            resuming.check_overwrite(resume, options.overwrite)
            self.folder = RunFolder(resume, kind=self.kind)
            self.folder.check_resumable(needs_checkpoint)
            resuming.check_run_dir(options.run_dir, resume)
            self.folder.lock(log=self.log)
            self.previous = self.folder.read_config()
            # The run's data: DATASET and the data options given again must name the run's own.
            dataset = resuming.check_dataset(options.dataset, self.previous)
            self.spec = resuming.check_data_options(options, dataset, self.previous)
            check_data_files(self.previous.get("data"), self.folder.path)  # its --labels, --test: the run's bytes
        elif default_dir is not None:
            self.new_folder(default_dir)
        self.settings = resuming.run_level(self.run_level, options, self.previous or {})
        if "progress_seconds" in self.settings:
            check_progress_seconds(self.settings["progress_seconds"])
            if "progress_seconds" in options.given and options.quiet:  # said, not refused: scripts pass both
                note(f"--progress-seconds {options.progress_seconds} has no effect with --quiet, which shows no "
                     f"progress")
        self.policy = self.checkpoint_policy()
        return self.previous

    def checkpoint_policy(self) -> CheckpointPolicy:
        """Every ``checkpoint_every`` epochs and ``checkpoint_minutes`` (a command without that option saves
        by epochs only: the MPI trainer, whose ranks must all save after the same step)."""
        return CheckpointPolicy(self.settings["checkpoint_every"], self.settings.get("checkpoint_minutes", 0.0))

    def where(self, trainer, changes: list[str]) -> str:
        """The resumed run's first line: where it stands, and the options given that changed it."""
        return (resuming.where_line(self.folder.path, trainer.epoch, trainer.batch_in_epoch, trainer.step)
                + (f"; applied: {', '.join(changes)}" if changes else ""))

    def new_folder(self, default_dir) -> None:
        """A new run's folder: --run-dir, else ``default_dir()``; checked here, made by :meth:`begin`."""
        self.folder = RunFolder(self.options.run_dir or default_dir(), kind=self.kind)
        self.folder.check_new(self.options.overwrite, command=self.command)  # "continue it with ..."

    def start(self):
        """The device and the CPU threads of the session (the count used is the run's from now on: a
        resume keeps it, since BLAS products differ in their last bits on another count)."""
        from ksae_cupy.backend import resolve_device
        from ksae_cupy.threads import set_blas_threads

        self.backend = resolve_device(self.device())
        self.threads_line = None
        if "threads" in self.settings:  # a command without --threads (the MPI trainer's ranks) leaves BLAS as it is
            self.threads_line, self.settings["threads"] = set_blas_threads(self.settings["threads"])
        return self.backend

    def started(self, backend, threads: int | None = None):
        """The device and CPU thread count a caller resolved once for several runs (a pack's), taken as
        :meth:`start` would resolve them for this run alone."""
        self.backend = backend
        if threads is not None:
            self.settings["threads"] = threads
        return backend

    def device(self) -> str:
        """The device this process asks for (the MPI trainer's rank picks its own GPU of a node)."""
        return self.settings["device"]

    def recorded_device(self) -> str:
        """The device config.json keeps, and a resume asks for: the one resolved (``auto`` is this machine's)."""
        return self.backend.name

    @property
    def data_dir(self) -> Path | None:
        return Path(self.settings["data_dir"]) if self.settings.get("data_dir") else None

    def load(self, spec):
        from ksae_cupy.datasets import load_dataset

        return load_dataset(spec, root=self.data_dir, log=self.log)

    # -- the folder ------------------------------------------------------------------------------
    def begin(self, record: dict, shown: str, trainer=None) -> None:
        """Make and lock the folder (a new run: its identity; a resumed one: the metrics logged after its
        checkpoint dropped), write config.json (``record`` and the session's settings), and say
        ``record[shown]``, the folder and the checkpoint schedule."""
        self.folder.create(log=self.log, new=not self.resuming, overwrite=self.options.overwrite)
        if trainer is not None and self.resuming:
            dropped = self.folder.drop_metrics_after(trainer.step, trainer.epoch, trainer.config.epochs)
            if dropped:
                self.say(dropped)  # which epochs, and whether each runs again
        if self.resuming and "codes_origin" in self.previous and "codes_origin" not in record:
            record = {**record, "codes_origin": self.previous["codes_origin"]}  # the same bytes (checked): kept
        self.config = {**record, **self.settings, "device": self.recorded_device(),
                       "data_dir": str(self.data_dir) if self.data_dir else None, "run_dir": str(self.folder.path)}
        self.folder.write_config(self.config)
        self.announce(record[shown])

    def announce(self, configuration: dict) -> None:
        """The lines :meth:`begin` says: the configuration, the folder and the checkpoint schedule (a pack,
        which names each run's folder on its every line, says its schedule once for all its runs)."""
        self.say("config: " + json.dumps(configuration, sort_keys=True))
        self.say(f"run folder: {self.folder.path}")
        minutes = f" and every {self.policy.seconds / 60:g} minutes" if self.policy.seconds else ""
        self.say(f"checkpoints: {self.folder.checkpoint}, every {self.policy.every_epochs} epochs{minutes}, "
                 f"and at the end")

    def release(self) -> None:
        if self.folder is not None:
            self.folder.release()

    def nested(self, folder: RunFolder) -> "RunLifecycle":
        """The lifecycle of a run folder inside this run's (a layer ``ksae-finetune --baseline`` pretrains),
        made and locked by the caller: this session's settings, device and checkpoint policy."""
        inner = RunLifecycle(self.command, folder.kind, self.options, self.echo)
        inner.folder, inner.settings, inner.backend = folder, self.settings, self.backend
        inner.policy = inner.checkpoint_policy()
        return inner

    # -- training --------------------------------------------------------------------------------
    def fit(self, job: "RunJob") -> None:
        """``job.fit(on_epoch, on_batch)`` under the checkpoint policy and the stop signals: each epoch's
        report into metrics.jsonl, its ``job.epoch_lines(report)`` said, then ``job.save()`` when the policy
        says (unless ``job.saves_itself``: its fit then saves by ``self.policy.after_epoch`` and at the end);
        mid-epoch when the minutes are up; at the end when the session trained a step. ``job.on_end()``
        runs once its fit has returned or raised (e.g. to clear a progress bar)."""
        def batch(done, total):
            job.on_batch(done, total)
            if self.policy.after_batch(done, total):
                job.save()

        def epoch(report):
            self.append_metrics(report)  # before the checkpoint: a resume drops lines past it
            for line in job.epoch_lines(report):
                self.say(line)
            if not job.saves_itself and self.policy.after_epoch(report.epoch):
                job.save()

        trainer = job.trainer()
        step_before = None if trainer is None else trainer.step
        if getattr(trainer, "tally", None) is not None and not trainer.tally.complete:
            self.say(f"note: {self.folder.checkpoint} was written before checkpoints kept an epoch's statistics: "
                     f"epoch {trainer.epoch + 1}'s line covers only its batches after the resume (from batch "
                     f"{trainer.batch_in_epoch + 1})")
        self.finished_before = trainer is not None and trainer.finished
        self.stop = self.stop_signals(job)
        self.started = time.perf_counter()
        self.policy.restart()  # the minutes count from the first step, not from loading
        try:
            try:
                # A step that overflows makes NumPy warn, then the loss is non-finite and the trainer says so
                # in one line (TrainingDiverged): the warning before it would only repeat it, worse.
                with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                    job.fit(epoch, batch)
            finally:
                self.stop.restore()
                job.on_end()
            if not job.saves_itself and self.needs_final_save(job.trainer(), step_before):
                job.save()
        except CheckpointWriteError as exc:  # what to do next depends on whether a checkpoint is there to resume
            then = (f"continue the run with: {self.command} --resume {self.folder.path}" if exc.kept else
                    "start the run again with --overwrite (no checkpoint was written to resume from)")
            raise exc.advise(then) from None

    # What a run over several processes does otherwise (parallel/distributed_run.py: RankLifecycle).
    def append_metrics(self, report) -> None:
        """An epoch's report into metrics.jsonl."""
        self.folder.append_metrics(report)

    def stop_signals(self, job):
        """The stop signals while ``job`` fits: set, with ``restore()`` and ``exit_status``."""
        return StopOnSignals(job.trainer, self.say, self.echo)

    def needs_final_save(self, trainer, step_before) -> bool:
        """Whether the end of fit saves: the session trained a step, or no checkpoint is there yet."""
        return trainer.step != step_before or not self.folder.checkpoint.exists()

    def end(self, trainer, done: str | None, where=None) -> None:
        """The session's last line: ``interrupted <where>; ... continue with: <command> --resume RUN``
        (then exit with the signal's status), ``nothing to train`` when the run had already trained all
        its epochs, else ``done`` formatted (None: the command says it). ``where(trainer)`` words the
        point a stopped run stands at (default: ``after epoch 8, batch 173``)."""
        if not trainer.finished:
            at = where(trainer) if where is not None else position(trainer.epoch, trainer.batch_in_epoch)
            self.echo(interrupted(at, self.folder.checkpoint, self.command, self.folder.path), err=True)
            sys.exit(self.stop.exit_status)
        if done is None:
            return
        if self.finished_before:
            self.echo(nothing_to_train(trainer.epoch))
        else:
            self.echo(done.format(epochs=epochs_done(trainer.epoch), seconds=time.perf_counter() - self.started,
                                  checkpoint=self.folder.checkpoint, run=self.folder.path))


class RunJob:
    """What :meth:`RunLifecycle.fit` trains: every command passes one (a subclass naming its trainer, how it
    fits, saves and words an epoch). The defaults: no line per epoch, nothing per batch or at the end, and
    saved by the lifecycle (``saves_itself`` False)."""

    saves_itself = False  # True: fit saves by the policy's epochs and at the end itself (ksae-train's)

    def trainer(self):
        """The trainer (None until fit makes it; the stop signals set its ``stop_requested``)."""
        raise NotImplementedError

    def fit(self, on_epoch, on_batch) -> None:
        """Train, calling ``on_epoch(report)`` after every epoch and ``on_batch(done, total)`` after every batch."""
        raise NotImplementedError

    def save(self) -> None:
        """Write the checkpoint."""
        raise NotImplementedError

    def epoch_lines(self, report) -> list[str]:
        """The lines said after an epoch (its report is in metrics.jsonl already)."""
        return []

    def on_batch(self, done: int, total: int) -> None:
        """After every batch (a progress bar)."""

    def on_end(self) -> None:
        """Once fit has returned or raised (a progress bar cleared)."""


def check_progress_seconds(seconds: float) -> None:
    if not seconds >= 0:  # NaN too
        raise KsaeError(f"--progress-seconds {seconds} is not allowed; use seconds >= 0 (0: a line every batch)")
