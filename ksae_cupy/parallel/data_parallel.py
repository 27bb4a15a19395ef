"""Data-parallel training over MPI ranks: every rank trains on its shard of each minibatch.

Launch (one process per rank; on GPUs one GPU per rank and ``--comm nccl``):

    mpiexec -n 4 python -m mpi4py -m ksae_cupy.cli.mpi_train train synthetic --hidden 256 --k 5 --epochs 20
    mpiexec -n 4 python -m mpi4py -m ksae_cupy.cli.mpi_train train --resume runs/synthetic-h256-k5-...

How one step works:

* every rank seeds the same host generator, so all ranks draw the same initial weights and
  the same permutation of each epoch: they agree on every global minibatch without
  exchanging indices;
* rank r takes the r-th contiguous shard of the global minibatch and computes its loss and
  gradients, scaled by ``n_shard / n_batch`` so that summing over ranks gives the gradient
  of the loss averaged over the *global* batch (the top-k is per example, so sharding rows
  changes nothing else);
* all gradients and the loss are packed into ONE flat buffer and summed by one all-reduce
  (MPI on host arrays, NCCL on GPU arrays); every rank then takes the same optimiser step,
  so the parameters stay identical on all ranks (checked at every checkpoint).

Rank 0 alone writes the run folder (config, metrics, checkpoints); a checkpoint is a
plain single-process checkpoint plus the world size, and resuming needs the same number
of ranks. Mistakes are found before any work, where every rank agrees on them (one line,
every rank leaves with status 2: :mod:`ksae_cupy.parallel.agree`); an error one rank meets
alone mid-run aborts the whole job (``MPI_Abort``) instead of leaving the other ranks
waiting in a collective forever.

``--shard-hidden`` instead splits the hidden units over the ranks (see
:mod:`ksae_cupy.parallel.sharded_hidden`). mpi4py is imported only inside functions.
"""
from __future__ import annotations

import dataclasses
import json
import signal
import time
import zlib
from pathlib import Path

import numpy as np

from ksae_cupy import model
from ksae_cupy.backend import to_host
from ksae_cupy.errors import KsaeError, one_line
from ksae_cupy.parallel.agree import RanksFailed, abort_on_error, agree, describe  # noqa: F401 - abort_on_error: bench's
from ksae_cupy.parallel.comm import StopAgreedOverRanks, shard_bounds
from ksae_cupy.training.trainer import Trainer, TrainingDiverged


class FlatGrads:
    """One contiguous buffer holding every gradient plus the loss: one all-reduce per step.

    ``views[name]`` are reshaped views into ``flat``; the loss is the last element (in the
    parameters' dtype: float32 loses nothing that matters for a logged loss).
    """

    def __init__(self, params: dict, xp):
        sizes = [int(np.prod(params[n].shape)) for n in model.PARAM_NAMES]
        dtype = params[model.PARAM_NAMES[0]].dtype
        self.flat = xp.zeros(sum(sizes) + 1, dtype=dtype)
        self.views, offset = {}, 0
        for name, size in zip(model.PARAM_NAMES, sizes):
            self.views[name] = self.flat[offset:offset + size].reshape(params[name].shape)
            offset += size
        self.loss_slot = offset

    def pack(self, grads: dict | None, loss: float, scale: float) -> None:
        """Copy ``scale * grads`` and ``scale * loss`` into the buffer (zeros for an empty shard)."""
        if grads is None:
            self.flat[...] = 0
            return
        for name, view in self.views.items():
            view[...] = grads[name]
            view *= view.dtype.type(scale)
        self.flat[self.loss_slot] = loss * scale

    @property
    def loss(self) -> float:
        return float(self.flat[self.loss_slot])


class DataParallelTrainer(StopAgreedOverRanks, Trainer):
    """A :class:`~ksae_cupy.training.trainer.Trainer` whose steps all-reduce gradients over ``comm``.

    ``allreduce(flat)`` sums a buffer of the backend's array type in place; with a GPU
    backend and MPI it is wrapped to go through the host.
    """

    takes_sparse_step = False  # its gradients come from the dense step, summed over ranks
    tracks_dead_units = False  # each rank holds a block of units or of examples: no per-unit window yet
    captures_gpu_step = False  # its step communicates between ranks: not one CUDA graph

    def __init__(self, config, backend, D, comm, allreduce, checkpoint=None):
        super().__init__(config, backend, D, checkpoint)
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.allreduce = allreduce
        self.grads = FlatGrads(self.params, backend.xp)
        self.fail_at_step = None  # (step, mode) for the fault-injection test only
        # A mid-epoch checkpoint holds the per-unit counts summed over the ranks: rank 0 goes on from the sum.
        if self.rank and "kept_h" in self.tally.values:
            self.tally.values["kept_h"] = backend.xp.zeros_like(self.tally.values["kept_h"])

    def _sum_host(self, a):
        """Sum a small array over the ranks through the host (epoch statistics)."""
        from ksae_cupy.parallel.comm import mpi_sum_inplace

        return mpi_sum_inplace(self.comm, np.ascontiguousarray(to_host(a)))

    def _batch_gradients(self, X_nd, k: int):
        """This rank's shard of the global batch ``X_nd``; gradients and loss summed over ranks."""
        lo, hi = shard_bounds(X_nd.shape[0], self.size, self.rank)
        self._maybe_fail()
        xp, H = self.backend.xp, self.config.hidden
        if hi > lo:
            loss, grads, cache = model.loss_and_grads(self.params, X_nd[lo:hi], k, self.config.topk,
                                                       self.config.activation)
            kept_h = xp.bincount(cache.idx_nk.ravel(), minlength=H)
            self.grads.pack(grads, loss, (hi - lo) / X_nd.shape[0])
        else:  # a last batch smaller than the rank count leaves some ranks idle
            kept_h = xp.zeros(H, dtype=np.int64)
            self.grads.pack(None, 0.0, 0.0)
        self.allreduce(self.grads.flat)
        # The global batch's loss and mean gradient, the same on every rank.
        return self.grads.loss, self.grads.views, kept_h

    def _dead_fraction(self, kept_count_h) -> float:
        """Dead units of the whole batch: this rank's counts summed over the ranks first."""
        return float((self._sum_host(kept_count_h) == 0).mean())

    def evaluate_loss(self, X_nd, k=None, chunk: int = 4096) -> float:
        """The mean loss over ``X_nd``, each rank evaluating its contiguous share."""
        lo, hi = shard_bounds(X_nd.shape[0], self.size, self.rank)
        partial = Trainer.evaluate_loss(self, X_nd[lo:hi], k, chunk) * (hi - lo) if hi > lo else 0.0
        return float(self._sum_host(np.array([partial]))[0]) / X_nd.shape[0]

    def check_replicas_agree(self) -> None:
        """Raise when the ranks' parameters differ (they must be bit-identical)."""
        crc = 0
        for name in model.PARAM_NAMES:
            crc = zlib.crc32(np.ascontiguousarray(to_host(self.params[name])).tobytes(), crc)
        crcs = self.comm.allgather(crc)
        if len(set(crcs)) != 1:
            raise KsaeError(f"the ranks' parameters differ after step {self.step} (CRC32 per rank: {crcs})")

    def checkpoint(self, preprocess=None):
        """Every rank's (rank 0 writes it); collective mid-epoch: the epoch's per-unit counts summed over the
        ranks, each having counted its shards of the batches."""
        ckpt = super().checkpoint(preprocess)
        ckpt.config["world_size"] = self.size
        if ckpt.epoch_tally is not None and "kept_h" in ckpt.epoch_tally:
            ckpt.epoch_tally["kept_h"] = self._sum_host(ckpt.epoch_tally["kept_h"])
        return ckpt

    def _maybe_fail(self) -> None:
        if self.fail_at_step is not None and self.step == self.fail_at_step[0]:
            if self.fail_at_step[1] == "exit":
                import os

                os._exit(3)  # a crash: no exception handler, no MPI_Abort
            raise RuntimeError(f"injected failure on rank {self.rank} at step {self.step}")


def _host_allreducer(backend, allreduce):
    """Wrap an MPI host all-reduce so it accepts the backend's (possibly GPU) buffers."""
    if not backend.is_gpu:
        return allreduce

    def through_host(flat):
        host = to_host(flat)
        allreduce(host)
        flat[...] = backend.asarray(host)
        return flat

    return through_host


# -- command line ----------------------------------------------------------------------

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
    from ksae_cupy.training.trainer import TrainConfig

    settings = RunSettings.from_record(previous)
    settings.shard_hidden = bool(ckpt.config.get("shard_hidden", False))
    return previous["dataset"], TrainConfig.from_dict(ckpt.config), settings, []


def run_distributed(dataset, config, settings: RunSettings, *, run_dir=None, resume=None, overwrite=False,
                    quiet=False, on_resume=None, fail_at_step=None, log=print):
    """Train on every rank of ``MPI.COMM_WORLD``; rank 0 writes the run folder. Returns the trainer.

    Every check that can fail before training (options, run folder, checkpoint, device, data) runs
    where every rank can agree on its outcome (:func:`~ksae_cupy.parallel.agree.agree`): a mistake
    is one line and every rank leaves with status 2, before any work. ``on_resume(folder, ckpt,
    previous_config)`` (rank 0, with ``resume``) returns ``(dataset, config, settings, changes)``:
    the run's own values with the options given applied or refused (default: the run as it was).
    Ctrl-C, SIGTERM and SIGHUP reaching any rank stop every rank after the same step; the job
    saves a checkpoint, prints the resume line and exits 128 + the signal.
    """
    from ksae_cupy.parallel.comm import world
    from ksae_cupy.session.runs import RunFolder

    comm = world()  # one line when mpi4py is missing
    from mpi4py import MPI

    rank, size = comm.rank, comm.size
    say = log if (rank == 0 and not quiet) else _silent
    signals = _StopSignals(say)  # from the start: a signal during the checks stops the job before any work

    plan = agree(comm, _plan, dataset, config, settings, run_dir, resume, overwrite, on_resume or keep_run_options,
                 size, rank0_only=True)
    dataset, config, settings, ckpt, folder_path, changes, record = comm.bcast(plan, root=0)  # one reader, copies
    folder = RunFolder(folder_path)
    try:
        return _train(comm, MPI, dataset, config, settings, ckpt, folder, changes, record, overwrite, signals, say,
                      log, fail_at_step)
    finally:
        if rank == 0:
            folder.release()  # a clean end empties .lock (a kill leaves the PID: "a run that ended without ...")


def _silent(*args, **kwargs):
    pass


def _plan(dataset, config, settings, run_dir, resume, overwrite, on_resume, size):
    """Rank 0: the run folder and what will run in it; every check that reads the folder."""
    from ksae_cupy.training.checkpoint import load_checkpoint
    from ksae_cupy.session.runs import RunFolder, default_run_dir

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
        dataset, config, settings, changes = on_resume(folder, ckpt, previous)
        record = {key: previous[key] for key in ("dataset", "dataset_sha256", "codes_origin") if key in previous}
        return dataset, config, settings, ckpt, folder.path, changes, record
    if dataset is None:
        raise KsaeError("missing DATASET; give a dataset name or file, or --resume RUN_DIR")
    folder = RunFolder(run_dir if run_dir is not None else default_run_dir(dataset, config.hidden, config.k))
    folder.check_new(overwrite, command=LAUNCH.format(size=size))
    return dataset, config, settings, None, folder.path, [], None


def _train(comm, MPI, dataset, config, settings, ckpt, folder, changes, record, overwrite, signals, say, log,
           fail_at_step):
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.parallel.comm import make_allreducer
    from ksae_cupy.schedules import schedule_reaches_k
    from ksae_cupy.training.checkpoint import save_checkpoint
    from ksae_cupy.session.runs import dataset_record

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
        data = load_dataset(dataset, root=Path(settings.data_dir) if settings.data_dir else None,
                            log=lambda msg: say(msg, err=True))
        config.validate(n_train=len(data.X_train))
        if ckpt is None:  # a rate whose first step moves no weight: on a one-process model of the same seed
            from ksae_cupy.training.learning_rate import check_rate_moves_weights
            from ksae_cupy.training.trainer import Trainer

            check_rate_moves_weights(Trainer(config, backend, data.dim), data.X_train, "--lr")
        if ckpt is not None and ckpt.params["W_dh"].shape[0] != data.dim:
            raise KsaeError(f"the checkpoint's model takes {ckpt.params['W_dh'].shape[0]} dimensions, "
                            f"{dataset} has {data.dim}")
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
    preprocess = dict(ckpt.preprocess) if ckpt is not None else dict(data.preprocess)

    def open_folder():
        folder.create(log=lambda msg: say(msg, err=True), new=ckpt is None, overwrite=overwrite)  # locked until the end
        if ckpt is not None:
            folder.check_checkpoint(ckpt.run_id, ckpt.config)  # sets the run's identity (checked in _plan)
        dropped = folder.drop_metrics_after(ckpt.step, ckpt.epoch, config.epochs) if ckpt is not None else None
        # A user file by absolute path and SHA-256 (a resume checks it); a resume keeps the run's record.
        folder.write_config({**(record if record is not None else dataset_record(dataset)), "train": config.to_dict(), **dataclasses.asdict(settings),
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
    if trainer.finished:  # "done: 3 epochs in 0.0 s" would read as if it had trained them
        if rank == 0:
            from ksae_cupy.training.wording import nothing_to_train

            log(nothing_to_train(trainer.epoch))
        return trainer

    saved = (ckpt.epoch, ckpt.step) if ckpt is not None else None

    def save():
        nonlocal saved
        try:
            trainer.check_replicas_agree()  # raises on every rank alike (an all-gather)
        except KsaeError as exc:
            raise RanksFailed([(0, describe(exc)[0], 1)], size, job_wide=True) from None
        ckpt_now = trainer.checkpoint(preprocess)  # collective when hidden units are sharded (None off rank 0)
        if ckpt_now is not None:
            ckpt_now.run_id = folder.run_id  # rank 0's (the one that writes): set by open_folder
        agree(comm, save_checkpoint, folder.checkpoint, ckpt_now, rank0_only=True)  # nobody runs ahead of it
        saved = (trainer.epoch, trainer.step)

    X_train = backend.asarray(data.X_train, dtype=trainer.dtype)
    X_valid = backend.asarray(data.X_valid, dtype=trainer.dtype)
    started = time.perf_counter()
    try:
        def on_epoch(report):
            agree(comm, folder.append_metrics, report, rank0_only=True)
            valid = f"  valid {report.valid_loss:.4f}" if report.valid_loss is not None else ""
            fve = "" if report.fve is None else f"  FVE {report.fve:.4f}" + (
                "" if report.valid_fve is None else f" valid {report.valid_fve:.4f}")
            l0 = "" if report.l0 is None else f"  L0 {report.l0:.1f}"
            say(f"epoch {report.epoch}/{config.epochs}  k {report.k}  loss {report.train_loss:.4f}{valid}{fve}{l0}  "
                f"dead {100 * report.dead_fraction:.1f}%  {report.samples_per_s:,.0f} samples/s")

        # Every rank stops at the same step: the stop is agreed over the ranks (StopAgreedOverRanks).
        trainer.fit(X_train, X_valid, on_epoch, should_checkpoint=lambda epoch: epoch % settings.checkpoint_every == 0,
                    checkpoint=save)
    except TrainingDiverged as exc:
        # Raised on every rank at the same step: the losses it checks are all-reduced and the
        # parameter check is agreed (StopAgreedOverRanks), so every rank leaves together.
        line = _diverged_line(exc, saved, folder, data.X_train) if rank == 0 else ""
        raise RanksFailed([(0, line, 1)], size, job_wide=True) from None
    save()
    if not trainer.finished:
        stopped = comm.allreduce(signals.received or 0, op=MPI.MAX) or int(signal.SIGTERM)
        if rank == 0:
            from ksae_cupy.training.wording import interrupted, position

            log(interrupted(position(trainer.epoch, trainer.batch_in_epoch), folder.checkpoint, LAUNCH.format(size=size),
                            folder.path), err=True)
        raise SystemExit(128 + stopped)  # every rank, together: see abort_on_error
    if rank == 0:
        from ksae_cupy.training.wording import epochs_done
        log(f"done: {epochs_done(trainer.epoch)} on {size} ranks in {time.perf_counter() - started:.1f} s; "
            f"checkpoint {folder.checkpoint}")
    return trainer


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
    once the trainer exists, it stops after the step on every rank (see StopAgreedOverRanks)."""

    def __init__(self, say):
        self.received, self.trainer, self.say = None, None, say
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


def _gpus_per_node() -> int:
    try:
        import cupy

        return max(1, cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no cupy or no GPU: resolve_device reports it
        return 1
