"""One MPI training run on every rank: the run folder, resume, signals and lines around the
:class:`~ksae_cupy.parallel.data_parallel.DataParallelTrainer` (or the sharded-hidden one).

    run_distributed(options, config, spec)   # every rank: the command's options (cli/mpi_train.py's MpiTrainOptions)

It runs through the run lifecycle every training command shares
(:class:`~ksae_cupy.session.lifecycle.RunLifecycle`: the checks of a new or resumed run folder, its
lock, the session's settings from config.json, the data's provenance, config.json, the job under the
checkpoint policy, the metrics, the last line) as :class:`RankLifecycle`, whose rank 0 alone does what
reads or writes the run folder and speaks, the other ranks getting its outcome, and through the same
epoch engine (:meth:`Trainer.fit <ksae_cupy.training.trainer.Trainer.fit>`). A checkpoint is a plain
single-process checkpoint plus the world size, and resuming needs the same number of ranks
(:mod:`ksae_cupy.parallel.resume`). Mistakes are found before any work, where every rank agrees on
them (one line, every rank leaves with status 2: :mod:`ksae_cupy.parallel.agree`); an error one rank
meets alone mid-run aborts the whole job (``MPI_Abort``) instead of leaving the other ranks waiting in
a collective forever.
"""
from __future__ import annotations

import signal
from pathlib import Path

from ksae_cupy.errors import KsaeError, one_line
from ksae_cupy.parallel.agree import RanksFailed, agree, describe
from ksae_cupy.session.fields import RUN_LEVEL
from ksae_cupy.session.lifecycle import RunJob, RunLifecycle
from ksae_cupy.session.runs import TRAIN as KIND
from ksae_cupy.training.trainer import TrainingDiverged


def _launch() -> str:
    """How to start the MPI trainer again, with this interpreter (``python`` may be another one, or
    none) and the ``mpiexec`` installed beside it (the mpi extra's MPICH) when there is one."""
    import shlex
    import sys

    beside = Path(sys.executable).with_name("mpiexec")
    mpiexec = shlex.quote(str(beside)) if beside.exists() else "mpiexec"
    return f"{mpiexec} -n {{size}} {shlex.quote(sys.executable)} -m mpi4py -m ksae_cupy.cli.mpi_train train"


LAUNCH = _launch()


def check_settings(settings: dict, size: int, hidden: int) -> None:
    """A one-line :class:`KsaeError` for how the ranks would share the work when it cannot run (the same
    answer on every rank)."""
    if settings["comm"] == "nccl" and not settings["device"].strip().lower().startswith("gpu"):
        raise KsaeError("--comm nccl needs --device gpu (NCCL sums GPU buffers); use --comm mpi on the CPU")
    if settings["shard_hidden"] and hidden < size:
        raise KsaeError(f"--shard-hidden: {hidden} hidden units cannot be split over {size} ranks; "
                        f"use at most {hidden} ranks, or more hidden units")


def run_distributed(options, config=None, spec=None, *, fail_at_step=None, log=print):
    """Train on every rank of ``MPI.COMM_WORLD``; rank 0 writes the run folder. Returns the trainer.

    ``options``: the command's values (``cli/mpi_train.py``'s ``MpiTrainOptions``, ``given`` the names typed);
    ``config`` and ``spec`` (the :class:`~ksae_cupy.datasets.user_files.DataSpec` of DATASET) a new run's, None with
    ``--resume``, whose run keeps its own with the options given applied or refused
    (:mod:`ksae_cupy.parallel.resume`). Every check that can fail before training (options, run folder, checkpoint,
    data files, device, data) runs where every rank can agree on its outcome
    (:func:`~ksae_cupy.parallel.agree.agree`): a mistake is one line and every rank leaves with status 2, before any
    work. Ctrl-C, SIGTERM and SIGHUP reaching any rank stop every rank after the same step; the job saves a
    checkpoint, prints the resume line and exits 128 + the signal.
    """
    from ksae_cupy.parallel.comm import world

    comm = world()  # one line when mpi4py is missing
    run = RankLifecycle(comm, options, log)
    try:
        return _train(comm, run, config, spec, fail_at_step)
    finally:
        run.release()  # rank 0: a clean end empties .lock (a kill leaves the PID: "a run that ended without ...")


def _silent(*args, **kwargs):
    pass


def _train(comm, run: "RankLifecycle", config, spec, fail_at_step):
    from mpi4py import MPI

    from ksae_cupy.parallel.comm import make_allreducer
    from ksae_cupy.parallel.data_parallel import DataParallelTrainer, _host_allreducer
    from ksae_cupy.session.runs import data_record, default_run_dir
    from ksae_cupy.session.train_run import drop_unreached_schedule

    rank, size, say = comm.rank, comm.size, run.say
    signals = run.signals = _StopSignals(comm, say)  # from the start: a signal during the checks stops it before any work

    def what_runs():
        """Rank 0, once the lifecycle has opened the run: its checkpoint and configuration, the options
        given applied or refused (a resume), and the record config.json keeps of its data."""
        if not run.resuming:
            return None, config, [], spec, data_record(spec)
        from ksae_cupy.parallel.resume import resumed_run
        from ksae_cupy.session.resuming import run_level_changes

        ckpt, resumed_config, changes = resumed_run(run.folder, run.options, size)
        changes += run_level_changes(run.settings, run.options.given, run.previous)
        return ckpt, resumed_config, changes, run.spec, data_record(run.spec)

    ckpt, config, changes, spec, record = run.open(lambda: default_run_dir(spec.data, config.hidden, config.k),
                                                   then=what_runs)
    settings = run.settings

    def prepare():
        """This rank's device and data (no communication: see agree)."""
        check_settings(settings, size, config.hidden)
        if ckpt is None:
            config.validate()
        backend = run.start()
        if settings["comm"] == "nccl" and not backend.is_gpu:
            raise KsaeError("--comm nccl needs --device gpu (NCCL sums GPU buffers); use --comm mpi on the CPU")
        data = run.load(spec)
        config.validate(n_train=len(data.X_train))
        if ckpt is None:  # a rate whose first step moves no weight: on a one-process model of the same seed
            from ksae_cupy.training.learning_rate import check_rate_moves_weights
            from ksae_cupy.training.trainer import Trainer

            check_rate_moves_weights(Trainer(config, backend, data.dim), data.X_train, "--lr")
        if ckpt is not None and ckpt.params["W_dh"].shape[0] != data.dim:
            raise KsaeError(f"the checkpoint's model takes {ckpt.params['W_dh'].shape[0]} dimensions, "
                            f"{spec.data} has {data.dim}")
        return backend, data

    # Rank 0 first (a dataset it downloads is then on disk for the others), then the rest.
    first = agree(comm, prepare, rank0_only=True)
    rest = agree(comm, prepare if rank else _silent) if size > 1 else None
    backend, data = first if rank == 0 else rest
    say(f"{backend.description}; {size} ranks, {'hidden units' if settings['shard_hidden'] else 'data'} sharded, "
        f"comm {settings['comm']}")
    if ckpt is None:  # ksae-train's rule, so that the same options name the run on --resume; every rank alike
        drop_unreached_schedule(config, say)

    allreduce = make_allreducer(comm, settings["comm"])  # NCCL's set-up is collective: not inside agree
    if settings["comm"] == "mpi":
        allreduce = _host_allreducer(backend, allreduce)

    def make_trainer():
        if settings["shard_hidden"]:
            from ksae_cupy.parallel.sharded_hidden import ShardedHiddenTrainer

            return ShardedHiddenTrainer(config, backend, data.dim, comm, allreduce, checkpoint=ckpt,
                                        topk_dist=settings["topk_dist"])
        return DataParallelTrainer(config, backend, data.dim, comm, allreduce, checkpoint=ckpt)

    trainer = agree(comm, make_trainer)
    trainer.fail_at_step = fail_at_step
    stopped = comm.allreduce(signals.received or 0, op=MPI.MAX)
    if stopped:  # nothing written yet: the run folder is as it was
        run.echo(f"{signal.Signals(stopped).name}: stopped before training began; "
                 + (f"the run in {run.folder.path} is as it was" if ckpt is not None else "nothing was written"),
                 err=True)
        raise SystemExit(128 + stopped)
    signals.trainer = trainer
    trainer.stop_requested = signals.received is not None

    if ckpt is not None:
        say(run.where(ckpt, changes))
    run.begin({**record, "train": config.to_dict(), "world_size": size}, "train", trainer)

    preprocess = dict(ckpt.preprocess) if ckpt is not None else dict(data.preprocess)
    job = DistributedJob(trainer, comm, run.folder, data, preprocess, saved=(ckpt.epoch, ckpt.step) if ckpt else None)
    run.fit(job)
    run.end(trainer, f"done: {{epochs}} on {size} ranks in {{seconds:.1f}} s; checkpoint {{checkpoint}}")
    return trainer


class RankLifecycle(RunLifecycle):
    """The run lifecycle on one rank of an MPI job. Rank 0 alone does what reads or writes the run folder
    (:meth:`open`: the checks, the lock, the settings; :meth:`begin`: the folder, config.json; the metrics;
    each agreed: a failure there stops every rank alike, in one line) and speaks; the other ranks get its
    outcome. Its own: the settings of how the ranks share the work (--comm, --shard-hidden, --topk-dist),
    each rank's GPU, the checkpoint schedule ``--checkpoint-every`` (no minutes: every rank saves after the
    same step), and the stop signals agreed over the ranks (:class:`_StopSignals`, installed from the
    job's start)."""

    run_level = RUN_LEVEL + ("comm", "shard_hidden", "topk_dist")

    def __init__(self, comm, options, log):
        super().__init__(LAUNCH.format(size=comm.size), KIND, options, log if comm.rank == 0 else _silent)
        self.comm, self.signals = comm, None

    def open(self, default_dir=None, needs_checkpoint: bool = True, then=None):
        """:meth:`RunLifecycle.open` on rank 0, then ``then()`` there (what the run holds, read once); every
        rank returns ``then``'s answer, with the run's folder, data and settings."""
        from ksae_cupy.session.runs import RunFolder

        def on_rank0():
            RunLifecycle.open(self, default_dir, needs_checkpoint)
            return (self.folder.path, self.previous, getattr(self, "spec", None), self.settings,
                    then() if then is not None else None)

        opened = agree(self.comm, on_rank0, rank0_only=True)
        path, self.previous, self.spec, self.settings, answer = self.comm.bcast(opened, root=0)  # one reader, copies
        if self.comm.rank != 0:
            self.folder, self.policy = RunFolder(path, kind=self.kind), self.checkpoint_policy()
        return answer

    def device(self) -> str:
        device = self.settings["device"]
        return f"gpu:{self.comm.rank % _gpus_per_node()}" if device.strip().lower() == "gpu" else device

    def recorded_device(self) -> str:
        return self.settings["device"]  # "gpu": each rank its own, again on resume

    def begin(self, record: dict, shown: str, trainer=None) -> None:
        agree(self.comm, RunLifecycle.begin, self, record, shown, trainer, rank0_only=True)

    def append_metrics(self, report) -> None:
        agree(self.comm, self.folder.append_metrics, report, rank0_only=True)

    def stop_signals(self, job) -> "_StopSignals":
        return self.signals

    def needs_final_save(self, trainer, step_before) -> bool:
        mine = super().needs_final_save(trainer, step_before) if self.comm.rank == 0 else None
        return self.comm.bcast(mine, root=0)


class DistributedJob(RunJob):
    """What :class:`RankLifecycle` trains on every rank: ``trainer`` on ``data`` (moved to its device here),
    its checkpoint saved collectively and written by rank 0, an epoch's line as the MPI trainer words it,
    and a divergence retold by rank 0 for every rank. ``saved``: the ``(epoch, step)`` of the last checkpoint."""

    def __init__(self, trainer, comm, folder, data, preprocess: dict, saved):
        self._trainer, self.comm, self.folder, self.preprocess, self.saved = trainer, comm, folder, preprocess, saved
        self.X_host = data.X_train  # for the divergence's advice: a rate derived from these rows
        self.X_train = trainer.backend.asarray(data.X_train, dtype=trainer.dtype)
        self.X_valid = trainer.backend.asarray(data.X_valid, dtype=trainer.dtype)

    def trainer(self):
        return self._trainer

    def fit(self, on_epoch, on_batch) -> None:
        # Every rank stops at the same step: the stop is agreed over the ranks (StopAgreedOverRanks).
        try:
            self._trainer.fit(self.X_train, self.X_valid, on_epoch, on_batch)
        except TrainingDiverged as exc:
            # Raised on every rank at the same step: the losses it checks are all-reduced and the
            # parameter check is agreed (StopAgreedOverRanks), so every rank leaves together.
            line = _diverged_line(exc, self.saved, self.folder, self.X_host) if self.comm.rank == 0 else ""
            raise RanksFailed([(0, line, 1)], self.comm.size, job_wide=True) from None

    def save(self) -> None:
        from ksae_cupy.training.checkpoint import save_checkpoint

        trainer = self._trainer
        try:
            trainer.check_replicas_agree()  # raises on every rank alike (an all-gather)
        except KsaeError as exc:
            raise RanksFailed([(0, describe(exc)[0], 1)], self.comm.size, job_wide=True) from None
        ckpt_now = trainer.checkpoint(self.preprocess)  # collective when hidden units are sharded (None off rank 0)
        if ckpt_now is not None:
            ckpt_now.run_id = self.folder.run_id  # rank 0's (the one that writes): set when the folder was opened
        agree(self.comm, save_checkpoint, self.folder.checkpoint, ckpt_now, rank0_only=True)  # nobody runs ahead
        self.saved = (trainer.epoch, trainer.step)

    def epoch_lines(self, report) -> list[str]:
        valid = f"  valid {report.valid_loss:.4f}" if report.valid_loss is not None else ""
        fve = "" if report.fve is None else f"  FVE {report.fve:.4f}" + (
            "" if report.valid_fve is None else f" valid {report.valid_fve:.4f}")
        l0 = "" if report.l0 is None else f"  L0 {report.l0:.1f}"
        return [f"epoch {report.epoch}/{self._trainer.config.epochs}  k {report.k}  loss {report.train_loss:.4f}"
                f"{valid}{fve}{l0}  unkept {100 * report.dead_fraction:.1f}%  {report.samples_per_s:,.0f} samples/s"]


def _diverged_line(exc, saved, folder, X_nd) -> str:
    """The divergence retold as ksae-train tells it: what was kept, and a rate for this data."""
    from ksae_cupy.training.learning_rate import auto_learning_rate, round_significant

    if exc.loss is None:  # the epoch's health check says what was kept itself
        return one_line(exc)
    kept = (f"the checkpoint {folder.checkpoint} holds epoch {saved[0]}, step {saved[1]}, written before it"
            if saved is not None else "nothing was saved (no checkpoint had been written yet)")
    auto = auto_learning_rate(X_nd)
    if exc.lr > auto:
        advice = f"use a smaller --lr, e.g. {auto} (what ksae-train's --lr auto derives from this data's scale)"
    else:
        advice = f"use a smaller --lr, e.g. {round_significant(exc.lr / 4, 2)}, or scale the data down"
    return f"the loss became {exc.loss} at epoch {exc.epoch}, step {exc.step} with --lr {exc.lr}; {kept}; {advice}"


class _StopSignals:
    """SIGINT, SIGTERM, SIGHUP (what mpiexec passes on, and what SLURM sends every task): noted;
    once the trainer exists, it stops after the step on every rank (see StopAgreedOverRanks). Installed
    for the whole job (a signal during the checks stops it before any work): :meth:`restore` leaves them."""

    def __init__(self, comm, say):
        self.comm, self.received, self.trainer, self.say = comm, None, None, say
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), self._handler)

    def _handler(self, signum, frame):
        first = self.received is None
        self.received = signum
        if self.trainer is not None:
            self.trainer.stop_requested = True
        if first:
            what = "after this step and saving a checkpoint" if self.trainer is not None else "before training begins"
            self.say(f"{signal.Signals(signum).name}: stopping every rank {what}", err=True)

    def restore(self) -> None:
        """Nothing: the handlers stay until the job ends (RunLifecycle.fit calls this after fit)."""

    @property
    def exit_status(self) -> int:
        """128 + the signal any rank received (SIGTERM's when none did), agreed: a collective."""
        from mpi4py import MPI

        return 128 + (self.comm.allreduce(self.received or 0, op=MPI.MAX) or int(signal.SIGTERM))


def _gpus_per_node() -> int:
    try:
        import cupy

        return max(1, cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no cupy or no GPU: resolve_device reports it
        return 1
