"""One MPI training run on every rank: the run folder, resume, signals and lines around the
:class:`~ksae_cupy.parallel.data_parallel.DataParallelTrainer` (or the sharded-hidden one).

    run_distributed(spec, config, settings, run_dir=..., resume=..., ...)   # every rank

It runs through the run lifecycle every training command shares
(:class:`~ksae_cupy.session.lifecycle.RunLifecycle`: the job under the checkpoint policy, the
metrics, the last line) as :class:`RankLifecycle`, whose rank 0 alone writes the run folder
(config, metrics, checkpoints) and speaks, and through the same epoch engine
(:meth:`Trainer.fit <ksae_cupy.training.trainer.Trainer.fit>`). A checkpoint is a plain
single-process checkpoint plus the world size, and resuming needs the same number of ranks; a
resume checks the run's data file and its ``--labels``, ``--test`` and ``--test-labels`` files
(:mod:`ksae_cupy.session.provenance`) as ``ksae-train --resume`` does. Mistakes are found before
any work, where every rank agrees on them (one line, every rank leaves with status 2:
:mod:`ksae_cupy.parallel.agree`); an error one rank meets alone mid-run aborts the whole job
(``MPI_Abort``) instead of leaving the other ranks waiting in a collective forever.
"""
from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

from ksae_cupy.errors import KsaeError, one_line
from ksae_cupy.parallel.agree import RanksFailed, agree, describe
from ksae_cupy.session.checkpoint_policy import CheckpointPolicy
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


@dataclasses.dataclass
class RunSettings:
    """An MPI run's options outside its training configuration. config.json keeps them, and a
    resume keeps every one that is not given again."""

    device: str = "cpu"
    comm: str = "mpi"
    shard_hidden: bool = False
    topk_dist: str = "threshold"
    checkpoint_every: int = 10
    data_dir: str | None = None

    @classmethod
    def from_record(cls, record: dict) -> "RunSettings":
        """From a run's config.json (a run written before a field existed gets its default)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in record.items() if key in names})

    def check(self, size: int, hidden: int) -> None:
        """A one-line :class:`KsaeError` for what cannot run (the same answer on every rank)."""
        if self.checkpoint_every <= 0:
            raise KsaeError(f"--checkpoint-every {self.checkpoint_every} is not allowed; use a positive number of epochs")
        if self.comm == "nccl" and not self.device.strip().lower().startswith("gpu"):
            raise KsaeError("--comm nccl needs --device gpu (NCCL sums GPU buffers); use --comm mpi on the CPU")
        if self.shard_hidden and hidden < size:
            raise KsaeError(f"--shard-hidden: {hidden} hidden units cannot be split over {size} ranks; "
                            f"use at most {hidden} ranks, or more hidden units")


def keep_run_options(folder, ckpt, previous: dict):
    """What a resume runs when the caller applies no options: the run as it was."""
    from ksae_cupy.datasets.user_files import DataSpec
    from ksae_cupy.training.trainer import TrainConfig

    settings = RunSettings.from_record(previous)
    settings.shard_hidden = bool(ckpt.config.get("shard_hidden", False))
    return DataSpec.from_record(previous["dataset"], previous.get("data")), TrainConfig.from_dict(ckpt.config), \
        settings, []


def run_distributed(spec, config, settings: RunSettings, *, run_dir=None, resume=None, overwrite=False,
                    quiet=False, on_resume=None, fail_at_step=None, log=print):
    """Train on every rank of ``MPI.COMM_WORLD``; rank 0 writes the run folder. Returns the trainer.

    ``spec``: the :class:`~ksae_cupy.datasets.user_files.DataSpec` of a new run (DATASET and its labels
    and splits; None with ``resume``). Every check that can fail before training (options, run folder,
    checkpoint, data files, device, data) runs where every rank can agree on its outcome
    (:func:`~ksae_cupy.parallel.agree.agree`): a mistake is one line and every rank leaves with status 2,
    before any work. ``on_resume(folder, ckpt, previous_config)`` (rank 0, with ``resume``) returns
    ``(spec, config, settings, changes)``: the run's own values with the options given applied or
    refused (default: the run as it was). Ctrl-C, SIGTERM and SIGHUP reaching any rank stop every rank
    after the same step; the job saves a checkpoint, prints the resume line and exits 128 + the signal.
    """
    from ksae_cupy.parallel.comm import world
    from ksae_cupy.session.runs import RunFolder

    comm = world()  # one line when mpi4py is missing
    from mpi4py import MPI

    rank, size = comm.rank, comm.size
    say = log if (rank == 0 and not quiet) else _silent
    signals = _StopSignals(comm, say)  # from the start: a signal during the checks stops the job before any work

    plan = agree(comm, _plan, spec, config, settings, run_dir, resume, overwrite, on_resume or keep_run_options,
                 size, rank0_only=True)
    spec, config, settings, ckpt, folder_path, changes, record = comm.bcast(plan, root=0)  # one reader, copies
    folder = RunFolder(folder_path)
    try:
        return _train(comm, MPI, spec, config, settings, ckpt, folder, changes, record, overwrite, signals, say,
                      quiet, log, fail_at_step)
    finally:
        if rank == 0:
            folder.release()  # a clean end empties .lock (a kill leaves the PID: "a run that ended without ...")


def _silent(*args, **kwargs):
    pass


def _plan(spec, config, settings, run_dir, resume, overwrite, on_resume, size):
    """Rank 0: the run folder and what will run in it, and the record config.json keeps of its data; every
    check that reads the folder (on a resume: the run's data files, by their SHA-256)."""
    from ksae_cupy.session.provenance import check_data_files, data_files_record
    from ksae_cupy.session.runs import RunFolder, dataset_record, default_run_dir
    from ksae_cupy.training.checkpoint import load_checkpoint

    if resume is not None:
        from ksae_cupy.session.resuming import check_overwrite

        check_overwrite(resume, overwrite)
        folder = RunFolder(resume)
        folder.check_resumable()
        ckpt = load_checkpoint(folder.checkpoint)
        folder.check_checkpoint(ckpt.run_id, ckpt.config)  # this folder's run, not a copy
        previous = folder.read_config()
        saved_size = ckpt.config.get("world_size")
        if saved_size is None:
            raise KsaeError(f"--resume {resume}: a run of ksae-train (one process: its checkpoint names no rank "
                            f"count); continue it with ksae-train --resume {resume}")
        if saved_size != size:
            raise KsaeError(f"--resume: the run was trained on {saved_size} ranks; resume it with mpiexec -n "
                            f"{saved_size} (this job has {size})")
        spec, config, settings, changes = on_resume(folder, ckpt, previous)
        check_data_files(previous.get("data"), folder.path)  # its --labels, --test: the run's bytes
        record = {key: previous[key] for key in ("dataset", "dataset_sha256", "data", "codes_origin")
                  if key in previous}
        if spec.data != previous["dataset"]:  # the run's data file moved (its bytes checked): recorded from now on
            record.update(dataset_record(spec.data))
        return spec, config, settings, ckpt, folder.path, changes, record
    if spec is None:
        raise KsaeError("missing DATASET; give a dataset name or file, or --resume RUN_DIR")
    folder = RunFolder(run_dir if run_dir is not None else default_run_dir(spec.data, config.hidden, config.k))
    folder.check_new(overwrite, command=LAUNCH.format(size=size))
    record = dataset_record(spec.data)  # a user file by absolute path and SHA-256 (a resume checks it)
    if spec.is_user_file:
        record["data"] = data_files_record(spec.record())  # labels and splits, their files hashed
    return spec, config, settings, None, folder.path, [], record


def _train(comm, MPI, spec, config, settings, ckpt, folder, changes, record, overwrite, signals, say, quiet, log,
           fail_at_step):
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.parallel.comm import make_allreducer
    from ksae_cupy.parallel.data_parallel import DataParallelTrainer, _host_allreducer
    from ksae_cupy.schedules import schedule_reaches_k

    rank, size = comm.rank, comm.size

    def prepare():
        """This rank's device and data (no communication: see agree)."""
        settings.check(size, config.hidden)
        if ckpt is None:
            config.validate()
        device = settings.device
        if device.strip().lower() == "gpu":
            device = f"gpu:{rank % _gpus_per_node()}"  # one GPU per rank on each node
        backend = resolve_device(device)
        if settings.comm == "nccl" and not backend.is_gpu:
            raise KsaeError("--comm nccl needs --device gpu (NCCL sums GPU buffers); use --comm mpi on the CPU")
        data = load_dataset(spec, root=Path(settings.data_dir) if settings.data_dir else None,
                            log=lambda msg: say(msg, err=True))
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
    say(f"{backend.description}; {size} ranks, {'hidden units' if settings.shard_hidden else 'data'} sharded, "
        f"comm {settings.comm}")
    if ckpt is None and config.k_start is not None and not schedule_reaches_k(config.epochs, config.k, config.k_start):
        say(f"note: in {config.epochs} epoch the k schedule would stay at k-start {config.k_start} and never reach "
            f"k {config.k}; training with k {config.k} from the start (as --no-k-schedule)")
        config.k_start = None  # as ksae-train does; every rank decides alike

    allreduce = make_allreducer(comm, settings.comm)  # NCCL's set-up is collective: not inside agree
    if settings.comm == "mpi":
        allreduce = _host_allreducer(backend, allreduce)

    def make_trainer():
        if settings.shard_hidden:
            from ksae_cupy.parallel.sharded_hidden import ShardedHiddenTrainer

            return ShardedHiddenTrainer(config, backend, data.dim, comm, allreduce, checkpoint=ckpt,
                                        topk_dist=settings.topk_dist)
        return DataParallelTrainer(config, backend, data.dim, comm, allreduce, checkpoint=ckpt)

    trainer = agree(comm, make_trainer)
    trainer.fail_at_step = fail_at_step
    stopped = comm.allreduce(signals.received or 0, op=MPI.MAX)
    if stopped:  # nothing written yet: the run folder is as it was
        if rank == 0:
            log(f"{signal.Signals(stopped).name}: stopped before training began; "
                + (f"the run in {folder.path} is as it was" if ckpt is not None else "nothing was written"), err=True)
        raise SystemExit(128 + stopped)
    signals.trainer = trainer
    trainer.stop_requested = signals.received is not None

    def open_folder():
        folder.create(log=lambda msg: say(msg, err=True), new=ckpt is None, overwrite=overwrite)  # locked until the end
        if ckpt is not None:
            folder.check_checkpoint(ckpt.run_id, ckpt.config)  # sets the run's identity (checked in _plan)
        dropped = folder.drop_metrics_after(ckpt.step, ckpt.epoch, config.epochs) if ckpt is not None else None
        folder.write_config({**record, "train": config.to_dict(), **dataclasses.asdict(settings),
                             "run_dir": str(folder.path), "world_size": size})
        return dropped

    dropped = agree(comm, open_folder, rank0_only=True)
    if ckpt is not None:
        from ksae_cupy.session.resuming import where_line

        say(where_line(folder.path, ckpt.epoch, ckpt.batch_in_epoch, ckpt.step)
            + (f"; applied: {', '.join(changes)}" if changes else ""))
        if dropped:
            say(dropped)
    say("config: " + json.dumps(config.to_dict(), sort_keys=True))
    say(f"run folder: {folder.path}")

    preprocess = dict(ckpt.preprocess) if ckpt is not None else dict(data.preprocess)
    job = DistributedJob(trainer, comm, folder, data, preprocess, saved=(ckpt.epoch, ckpt.step) if ckpt else None)
    run = RankLifecycle(comm, folder, settings, signals, quiet, log)
    run.fit(job)
    run.end(trainer, f"done: {{epochs}} on {size} ranks in {{seconds:.1f}} s; checkpoint {{checkpoint}}")
    return trainer


class RankLifecycle(RunLifecycle):
    """The run lifecycle on one rank of an MPI job: :meth:`RunLifecycle.fit` and :meth:`RunLifecycle.end`,
    with rank 0 alone writing the metrics (agreed: a failed write stops every rank alike) and speaking,
    the checkpoint schedule ``--checkpoint-every`` (no minutes), the stop signals agreed over the ranks
    (:class:`_StopSignals`, installed from the job's start), and rank 0's answer, shared, wherever a
    decision reads the run folder."""

    def __init__(self, comm, folder, settings: RunSettings, signals: "_StopSignals", quiet: bool, log):
        super().__init__(LAUNCH.format(size=comm.size), KIND, {"quiet": quiet}, set(),
                         log if comm.rank == 0 else _silent)
        self.comm, self.folder, self.signals = comm, folder, signals
        self.policy = CheckpointPolicy(settings.checkpoint_every, 0.0)

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
        self.learner, self.comm, self.folder, self.preprocess, self.saved = trainer, comm, folder, preprocess, saved
        self.X_host = data.X_train  # for the divergence's advice: a rate derived from these rows
        self.X_train = trainer.backend.asarray(data.X_train, dtype=trainer.dtype)
        self.X_valid = trainer.backend.asarray(data.X_valid, dtype=trainer.dtype)

    def trainer(self):
        return self.learner

    def fit(self, on_epoch, on_batch) -> None:
        # Every rank stops at the same step: the stop is agreed over the ranks (StopAgreedOverRanks).
        try:
            self.learner.fit(self.X_train, self.X_valid, on_epoch, on_batch)
        except TrainingDiverged as exc:
            # Raised on every rank at the same step: the losses it checks are all-reduced and the
            # parameter check is agreed (StopAgreedOverRanks), so every rank leaves together.
            line = _diverged_line(exc, self.saved, self.folder, self.X_host) if self.comm.rank == 0 else ""
            raise RanksFailed([(0, line, 1)], self.comm.size, job_wide=True) from None

    def save(self) -> None:
        from ksae_cupy.training.checkpoint import save_checkpoint

        trainer = self.learner
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
        return [f"epoch {report.epoch}/{self.learner.config.epochs}  k {report.k}  loss {report.train_loss:.4f}"
                f"{valid}{fve}{l0}  dead {100 * report.dead_fraction:.1f}%  {report.samples_per_s:,.0f} samples/s"]


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
