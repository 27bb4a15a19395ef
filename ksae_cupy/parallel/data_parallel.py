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

The run around the trainer (the run folder, which rank 0 alone writes; resume; signals; the
lines) is :mod:`ksae_cupy.parallel.distributed_run`'s, through the same run lifecycle as
``ksae-train``'s.

``--shard-hidden`` instead splits the hidden units over the ranks (see
:mod:`ksae_cupy.parallel.sharded_hidden`). mpi4py is imported only inside functions.
"""
from __future__ import annotations

import zlib

import numpy as np

from ksae_cupy import model
from ksae_cupy.backend import to_host
from ksae_cupy.errors import KsaeError
from ksae_cupy.parallel.comm import StopAgreedOverRanks, shard_bounds
from ksae_cupy.training.trainer import Trainer


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

    def _batch_gradients(self, X_nd, k: int, X_rows=None, dead_h=None, params=None):
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
        return self.grads.loss, None, self.grads.views, kept_h

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
