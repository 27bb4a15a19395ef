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
of ranks. An error on any rank aborts the whole job (``MPI_Abort``) instead of leaving the
other ranks waiting in a collective forever.

``--shard-hidden`` instead splits the hidden units over the ranks (see
:mod:`ksae_cupy.parallel.sharded_hidden`). mpi4py is imported only inside functions.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import zlib

import numpy as np

from ksae_cupy import model
from ksae_cupy.backend import to_host
from ksae_cupy.errors import KsaeError, one_line
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

    def __init__(self, config, backend, D, comm, allreduce, checkpoint=None):
        super().__init__(config, backend, D, checkpoint)
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.allreduce = allreduce
        self.grads = FlatGrads(self.params, backend.xp)
        self.fail_at_step = None  # (step, mode) for the fault-injection test only

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
        ckpt = super().checkpoint(preprocess)
        ckpt.config["world_size"] = self.size
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

def run_distributed(dataset, config, *, run_dir, resume, device, comm_kind, checkpoint_every, data_dir, quiet,
                    shard_hidden=False, topk_dist="threshold", fail_at_step=None, log=print):
    """Train on every rank of ``MPI.COMM_WORLD``; rank 0 writes ``run_dir``. Returns the trainer."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.training.checkpoint import load_checkpoint
    from ksae_cupy.parallel.comm import make_allreducer, world
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.schedules import schedule_reaches_k
    from ksae_cupy.training.runs import RunFolder, default_run_dir
    from ksae_cupy.training.trainer import TrainConfig

    comm = world()
    rank, size = comm.rank, comm.size
    say = log if (rank == 0 and not quiet) else (lambda *a, **kw: None)
    if device.startswith("gpu") and ":" not in device:
        device = f"gpu:{rank % _gpus_per_node()}"  # one GPU per rank on each node
    backend = resolve_device(device)
    if comm_kind == "nccl" and not backend.is_gpu:
        raise KsaeError("--comm nccl needs --device gpu (NCCL sums GPU buffers); use --comm mpi on the CPU")

    ckpt = None
    if resume is not None:
        folder = RunFolder(resume)
        if rank == 0:
            folder.check_resumable()
            ckpt = load_checkpoint(folder.checkpoint)
            previous = folder.read_config()
        else:
            previous = None
        ckpt, previous = comm.bcast((ckpt, previous), root=0)  # one reader, the others get a copy
        saved_size = ckpt.config.get("world_size")
        if saved_size != size:
            raise KsaeError(f"--resume: the run was trained on {saved_size} ranks; resume it with mpiexec -n {saved_size} "
                            f"(this job has {size})")
        if bool(ckpt.config.get("shard_hidden", False)) != shard_hidden:
            raise KsaeError("--resume: --shard-hidden must be given exactly when the run used it")
        if dataset is not None and dataset != previous.get("dataset"):
            raise KsaeError(f"--resume: DATASET {dataset!r} contradicts the run's dataset {previous.get('dataset')!r}")
        dataset = previous["dataset"]
        config = TrainConfig.from_dict(ckpt.config)
    else:
        if dataset is None:
            raise KsaeError("missing DATASET; give a dataset name or file, or --resume RUN_DIR")
        config.validate()
        if run_dir is None:
            run_dir = comm.bcast(default_run_dir(dataset, config.hidden, config.k) if rank == 0 else None, root=0)
        folder = RunFolder(run_dir)
        if rank == 0:
            folder.check_new()
    comm.Barrier()

    say(f"{backend.description}; {size} ranks, {'hidden units' if shard_hidden else 'data'} sharded, comm {comm_kind}")
    data = load_dataset(dataset, root=data_dir, log=lambda msg: say(msg, err=True) if rank == 0 else None)
    config.validate(n_train=len(data.X_train))
    if ckpt is None and config.k_start is not None and not schedule_reaches_k(config.epochs, config.k, config.k_start):
        say(f"note: in {config.epochs} epoch the k schedule would stay at k-start {config.k_start} and never reach "
            f"k {config.k}; training with k {config.k} from the start (as --no-k-schedule)")
        config.k_start = None  # as ksae-train does; every rank decides alike
    D = data.dim
    if ckpt is not None and ckpt.params["W_dh"].shape[0] != D:
        raise KsaeError(f"the checkpoint's model takes {ckpt.params['W_dh'].shape[0]} dimensions, {dataset} has {D}")
    allreduce = make_allreducer(comm, comm_kind)
    if comm_kind == "mpi":
        allreduce = _host_allreducer(backend, allreduce)
    if shard_hidden:
        from ksae_cupy.parallel.sharded_hidden import ShardedHiddenTrainer

        trainer = ShardedHiddenTrainer(config, backend, D, comm, allreduce, checkpoint=ckpt, topk_dist=topk_dist)
    else:
        trainer = DataParallelTrainer(config, backend, D, comm, allreduce, checkpoint=ckpt)
    trainer.fail_at_step = fail_at_step
    preprocess = dict(ckpt.preprocess) if ckpt is not None else dict(data.preprocess)

    if rank == 0:
        folder.create(log=lambda msg: say(msg, err=True), new=ckpt is None)  # locked for the job's life
        if ckpt is not None:  # epochs logged after the checkpoint run again: log each once
            folder.truncate_metrics(ckpt.step)
        folder.write_config({"dataset": dataset, "device": backend.name, "train": config.to_dict(),
                             "checkpoint_every": checkpoint_every, "run_dir": str(folder.path),
                             "world_size": size, "shard_hidden": shard_hidden, "comm": comm_kind})
        say("config: " + json.dumps(config.to_dict(), sort_keys=True))
        say(f"run folder: {folder.path}")

    def save():
        trainer.check_replicas_agree()
        ckpt_now = trainer.checkpoint(preprocess)  # collective when hidden units are sharded
        if rank == 0:
            from ksae_cupy.training.checkpoint import save_checkpoint

            save_checkpoint(folder.checkpoint, ckpt_now)
        comm.Barrier()  # nobody runs ahead of (or exits before) the written checkpoint

    X_train = backend.asarray(data.X_train, dtype=trainer.dtype)
    X_valid = backend.asarray(data.X_valid, dtype=trainer.dtype)
    started = time.perf_counter()
    received = _stop_on_signals(trainer, say)
    with backend.use():
        while not trainer.finished:
            report = trainer.run_epoch(X_train, X_valid)
            if report is None:  # every rank agreed to stop mid-epoch
                break
            if rank == 0:
                folder.append_metrics(report)
                valid = f"  valid {report.valid_loss:.4f}" if report.valid_loss is not None else ""
                say(f"epoch {report.epoch}/{config.epochs}  k {report.k}  loss {report.train_loss:.4f}{valid}  "
                    f"dead {100 * report.dead_fraction:.1f}%  {report.samples_per_s:,.0f} samples/s")
            if report.epoch % checkpoint_every == 0:
                save()
            if trainer.stop_requested:
                break
    save()
    if not trainer.finished:
        if rank == 0:
            log(f"interrupted at epoch {trainer.epoch + 1}, batch {trainer.batch_in_epoch}; checkpoint saved to "
                f"{folder.checkpoint}; continue with: mpiexec -n {size} python -m mpi4py -m ksae_cupy.cli.mpi_train "
                f"train --resume {folder.path}", err=True)
        sys.exit(128 + (received[0] or signal.SIGTERM))  # every rank, together: see abort_on_error
    if rank == 0:
        log(f"done: {trainer.epoch} epochs on {size} ranks in {time.perf_counter() - started:.1f} s; "
            f"checkpoint {folder.checkpoint}")
    return trainer


def _stop_on_signals(trainer, say) -> list:
    """SIGINT, SIGTERM, SIGHUP (mpiexec and SLURM pass them to the ranks): stop after the step
    on every rank, save, exit 128 + the signal. Returns a one-item list: the signal received here."""
    received = [None]

    def handler(signum, frame):
        received[0] = signum
        trainer.stop_requested = True
        say(f"\n{signal.Signals(signum).name}: stopping every rank after this step and saving a checkpoint",
            err=True)

    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), handler)
    return received


def _gpus_per_node() -> int:
    try:
        import cupy

        return max(1, cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no cupy or no GPU: resolve_device reports it
        return 1


def abort_on_error(func):
    """Run ``func``; on any error print it with the rank and ``MPI_Abort`` the whole job.

    Without this, one rank leaving (even with a clean ``sys.exit``) would leave the others
    blocked in their next collective forever.
    """
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except SystemExit as exc:
            if exc.code in (0, None):
                raise
            if isinstance(exc.code, int) and exc.code > 128:  # every rank stopped by a signal, saved, together
                _exit_together(exc.code)
            _abort(int(exc.code) if isinstance(exc.code, int) else 1, None)
        except TrainingDiverged as exc:
            _abort(1, exc)
        except KsaeError as exc:
            _abort(2, exc)
        except BaseException as exc:  # noqa: BLE001 - anything else: report, abort everyone
            _abort(1, exc)

    return wrapper


def _exit_together(status: int) -> None:
    """Leave with ``status`` on every rank without MPI_Abort (which mpi4py's runner would call
    for a non-zero exit, adding a line per rank to a clean stop)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
    except ImportError:
        pass
    os._exit(status)


def _abort(status: int, exc) -> None:
    rank = "?"
    try:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.rank
    except ImportError:
        MPI = None
    if exc is not None:
        kind = "" if isinstance(exc, KsaeError) else f"{type(exc).__name__}: "
        # One write of the whole line: ranks that fail together must not run into one line.
        line = f"error: [rank {rank}] {kind}{one_line(exc)}\n"
        sys.stderr.flush()
        os.write(sys.stderr.fileno(), line.encode("utf-8", "replace"))
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.size > 1:
        MPI.COMM_WORLD.Abort(status)
    sys.exit(status)
