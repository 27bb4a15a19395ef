"""Training with the hidden units split over ranks (``--shard-hidden``): model parallelism.

Rank r holds the columns ``[off_r, off_r + H_r)`` of ``W_dh`` and ``b_h`` (and their
velocities); ``c_d`` is replicated. Every rank sees the whole minibatch. One step:

    Z_local   = X W_local + b_local                      (no communication)
    keep      = sharded_topk(Z_local, k)                 (counts only, see dist_topk)
    Xhat      = allreduce(Zs_local W_local^T) + c        (one N x D all-reduce)
    R         = (Xhat - X) / N                           (identical on every rank)
    dW_local  = X^T dZ_local + R^T Zs_local,  db_local, dc = sum_n R   (no communication)

so per step the wire carries the top-k counts and one N x D sum, never a D x H gradient:
this pays off when H is large (wide dictionaries) and N x D is small. Initial weights are
drawn in full from the seed on every rank and sliced, so the run starts exactly like a
single-process one; checkpoints gather the columns to rank 0 and are ordinary
single-process checkpoints (plus ``world_size`` and ``shard_hidden``).
"""
from __future__ import annotations

import zlib

import numpy as np

from ksae_cupy import model
from ksae_cupy.backend import to_host
from ksae_cupy.training import epochs
from ksae_cupy.training.checkpoint import Checkpoint
from ksae_cupy.parallel.sharded_topk import sharded_topk
from ksae_cupy.parallel.comm import StopAgreedOverRanks, shard_bounds
from ksae_cupy.errors import KsaeError, OptionError, literal
from ksae_cupy.training.trainer import Trainer


class ShardedHiddenTrainer(StopAgreedOverRanks, Trainer):
    """A Trainer whose parameters are this rank's block of hidden units."""

    takes_sparse_step = False  # its gradients come from the dense step, summed over ranks
    tracks_dead_units = False  # each rank holds a block of units or of examples: no per-unit window yet
    captures_gpu_step = False  # its step communicates between ranks: not one CUDA graph

    def __init__(self, config, backend, D, comm, allreduce, checkpoint=None, topk_dist="threshold"):
        super().__init__(config, backend, D, checkpoint)  # full arrays, then keep our block
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        if config.activation != "linear":  # the sharded forward below selects linear units only
            raise OptionError("shard_hidden", f"{{name}} trains linear hidden units; activation "
                                              f"{literal(repr(config.activation))} is not supported")
        if config.hidden < comm.size:
            raise OptionError("shard_hidden", f"{{name}}: {config.hidden} hidden units cannot be split over "
                                              f"{comm.size} ranks")
        self.allreduce, self.topk_dist = allreduce, topk_dist
        self.col_lo, self.col_hi = shard_bounds(config.hidden, comm.size, comm.rank)
        for store in (self.params, self.optimizer.velocities):
            store["W_dh"] = backend.xp.ascontiguousarray(store["W_dh"][:, self.col_lo:self.col_hi])
            store["b_h"] = backend.xp.ascontiguousarray(store["b_h"][self.col_lo:self.col_hi])
        if "kept_h" in self.tally.values:  # a mid-epoch checkpoint's counts of every unit: this rank's block
            self.tally.values["kept_h"] = self.tally.values["kept_h"][self.col_lo:self.col_hi].copy()
        self.fail_at_step = None

    def _sum_host(self, a):
        from ksae_cupy.parallel.comm import mpi_sum_inplace

        return mpi_sum_inplace(self.comm, np.ascontiguousarray(to_host(a)))

    def forward(self, X_nd, k: int):
        """``(Xhat_nd, keep_nh, Zs_nh)``: the global reconstruction and this rank's kept code."""
        xp = self.backend.xp
        Z_nh = model.hidden_preactivations(self.params, X_nd)
        keep_nh = sharded_topk(Z_nh, k, self.comm, self.col_lo, self.topk_dist)
        Zs_nh = xp.where(keep_nh, Z_nh, Z_nh.dtype.type(0))
        Xhat_nd = xp.ascontiguousarray(Zs_nh @ self.params["W_dh"].T)
        self.allreduce(Xhat_nd)  # sum of every block's contribution
        Xhat_nd += self.params["c_d"]
        return Xhat_nd, keep_nh, Zs_nh

    def loss_and_grads(self, X_nd, k: int):
        """``(loss, grads of this rank's block and of c_d, keep_nh)``."""
        xp = self.backend.xp
        Xhat_nd, keep_nh, Zs_nh = self.forward(X_nd, k)
        loss, R_nd = model.reconstruction_loss(Xhat_nd, X_nd)
        dZ_nh = xp.where(keep_nh, R_nd @ self.params["W_dh"], R_nd.dtype.type(0))
        dW_dh = xp.concatenate([X_nd, R_nd]).T @ xp.concatenate([dZ_nh, Zs_nh])
        return loss, {"W_dh": dW_dh, "b_h": dZ_nh.sum(axis=0), "c_d": R_nd.sum(axis=0)}, keep_nh

    def _batch_gradients(self, X_nd, k: int, X_rows=None, dead_h=None, params=None):
        """The whole batch on every rank; gradients of this rank's block (and of ``c_d``)."""
        if self.fail_at_step is not None and self.step == self.fail_at_step[0]:
            raise RuntimeError(f"injected failure on rank {self.rank} at step {self.step}")
        loss, grads, keep_nh = self.loss_and_grads(X_nd, k)
        return loss, None, grads, keep_nh.sum(axis=0)

    def _dead_fraction(self, kept_count_h) -> float:
        """Dead units over all blocks: each rank counts its own, the counts are summed."""
        dead = self._sum_host(np.array([int((kept_count_h == 0).sum())], dtype=np.int64))[0]
        return float(dead) / self.config.hidden

    def evaluate_loss(self, X_nd, k=None, chunk: int = 4096) -> float:
        k = self.config.k if k is None else k
        total = 0.0
        for start in range(0, X_nd.shape[0], chunk):
            X_chunk = X_nd[start:start + chunk]
            Xhat, _, _ = self.forward(X_chunk, k)
            R = Xhat - X_chunk
            total += 0.5 * float(self.backend.xp.vdot(R, R))
        return total / X_nd.shape[0]

    def check_replicas_agree(self) -> None:
        """The replicated ``c_d`` must be bit-identical on every rank."""
        crcs = self.comm.allgather(zlib.crc32(np.ascontiguousarray(to_host(self.params["c_d"])).tobytes()))
        if len(set(crcs)) != 1:
            raise KsaeError(f"the ranks' decoder biases differ after step {self.step} (CRC32 per rank: {crcs})")

    def checkpoint(self, preprocess=None) -> Checkpoint | None:
        """Collective: gathers every block to rank 0, which gets the full checkpoint (others None)."""
        full = {}
        for group, store in (("params", self.params), ("optim", self.optimizer.velocities)):
            blocks = {name: self.comm.gather(to_host(store[name]), root=0) for name in ("W_dh", "b_h")}
            if self.rank == 0:
                full[group] = {"W_dh": np.concatenate(blocks["W_dh"], axis=1),
                               "b_h": np.concatenate(blocks["b_h"]), "c_d": to_host(store["c_d"])}
        tally = epochs.tally_state(self)
        if tally is not None and "kept_h" in tally:  # the epoch's per-unit counts, block by block
            blocks = self.comm.gather(tally["kept_h"], root=0)
            tally["kept_h"] = np.concatenate(blocks) if self.rank == 0 else None
        if self.rank != 0:
            return None
        config = self.config.to_dict()
        config.update(world_size=self.size, shard_hidden=True)
        return Checkpoint(params=full["params"], velocities=full["optim"], config=config, epoch=self.epoch,
                          step=self.step, batch_in_epoch=self.batch_in_epoch,
                          rng_state=self.rng.bit_generator.state,
                          epoch_perm=self.epoch_perm if self.batch_in_epoch else None,
                          preprocess=dict(preprocess or {}), epoch_tally=tally)
