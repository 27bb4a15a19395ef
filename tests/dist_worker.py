"""Run under mpiexec by tests/test_distributed.py; each subcommand writes results to OUT_DIR."""
import sys

import numpy as np
from mpi4py import MPI

from ksae_cupy import model
from ksae_cupy.backend import CPU
from ksae_cupy.comm import MPIAllreducer
from ksae_cupy.dist_topk import sharded_topk
from ksae_cupy.distributed import DataParallelTrainer, shard_bounds
from ksae_cupy.train import TrainConfig


def one_step(out_dir, dtype):
    """One data-parallel step on a 64-example batch; every rank saves its parameters."""
    comm = MPI.COMM_WORLD
    X = np.random.default_rng(1).standard_normal((64, 12)).astype(dtype)
    cfg = TrainConfig(hidden=20, k=3, k_start=None, epochs=1, batch_size=64, dtype=dtype, seed=5)
    trainer = DataParallelTrainer(cfg, CPU, 12, comm, MPIAllreducer(comm))
    trainer.run_epoch(X)  # one batch = one step
    np.savez(f"{out_dir}/step_{dtype}_rank{comm.rank}.npz", **trainer.params)


def topk_cases(out_dir, method):
    """Sharded top-k on random rows, rows full of ties, -0.0/+0.0 and NaN; saves global masks."""
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(2)
    H = 23
    cases = {
        "random": rng.standard_normal((40, H)).astype(np.float32),
        "all_equal": np.ones((6, H), np.float32),
        "few_values": rng.integers(0, 3, (40, H)).astype(np.float32),
        "zeros_nan": np.where(rng.random((20, H)) < 0.3, np.nan, np.where(rng.random((20, H)) < 0.5, -0.0, 0.0)).astype(np.float32),
    }
    results = {}
    lo, hi = shard_bounds(H, comm.size, comm.rank)
    for name, Z in cases.items():
        for k in (1, 5, H):
            keep = sharded_topk(Z[:, lo:hi], k, comm, lo, method)
            blocks = comm.gather(keep, root=0)
            if comm.rank == 0:
                results[f"{name}_k{k}"] = np.concatenate(blocks, axis=1)
                results[f"{name}_k{k}_Z"] = Z
    if comm.rank == 0:
        np.savez(f"{out_dir}/topk_{method}_{comm.size}.npz", **results)


if __name__ == "__main__":
    what, out_dir, arg = sys.argv[1], sys.argv[2], sys.argv[3]
    {"step": one_step, "topk": topk_cases}[what](out_dir, arg)
