"""Run under mpiexec by tests/test_distributed.py; each subcommand writes results to OUT_DIR."""
import sys

import numpy as np
from mpi4py import MPI

from ksae_cupy import model
from ksae_cupy.backend import CPU
from ksae_cupy.parallel.comm import MPIAllreducer
from ksae_cupy.parallel.sharded_topk import sharded_topk
from ksae_cupy.parallel.comm import shard_bounds
from ksae_cupy.parallel.data_parallel import DataParallelTrainer
from ksae_cupy.training.trainer import TrainConfig


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


def volume_cases(out_dir, _unused):
    """Bytes counted by CountingComm against the formulas; rank 0 saves every mismatch."""
    import json

    from ksae_cupy.parallel.commvolume import CountingComm, dp_allreduce_volume, topk_volume

    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(3)
    checked, mismatches = 0, []
    # H not divisible by the rank count, and k above a block's width (gather caps at H_r).
    for dtype in ("float32", "float64"):
        for N, H, k in ((7, 23, 1), (7, 23, 5), (7, 23, 11), (5, 40, 40)):
            Z = rng.standard_normal((N, H)).astype(dtype)
            lo, hi = shard_bounds(H, comm.size, comm.rank)
            for method in ("threshold", "gather"):
                counting = CountingComm(comm)
                sharded_topk(np.ascontiguousarray(Z[:, lo:hi]), k, counting, lo, method)
                counted, formula = counting.volume(), topk_volume(method, N, H, k, comm.size, comm.rank, dtype)
                checked += 1
                if counted != formula:
                    mismatches.append(f"{method} {dtype} N={N} H={H} k={k} rank {comm.rank}: {counted} != {formula}")
    # The data-parallel step: one all-reduce of W, b, c and the loss per step (3 steps here).
    counting = CountingComm(comm)
    cfg = TrainConfig(hidden=20, k=3, k_start=None, epochs=1, batch_size=10, dtype="float32", seed=5)
    DataParallelTrainer(cfg, CPU, 12, comm, MPIAllreducer(counting)).run_epoch(rng.random((30, 12), dtype=np.float32))
    steps = dp_allreduce_volume(12, 20, comm.size)
    expected = steps + steps + steps
    checked += 1
    if counting.volume() != expected:
        mismatches.append(f"data-parallel rank {comm.rank}: {counting.volume()} != {expected}")
    everything = comm.gather((checked, mismatches), root=0)
    if comm.rank == 0:
        result = {"checked": sum(c for c, _ in everything), "mismatches": [m for _, ms in everything for m in ms]}
        with open(f"{out_dir}/volume_{comm.size}.json", "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    what, out_dir, arg = sys.argv[1], sys.argv[2], sys.argv[3]
    {"step": one_step, "topk": topk_cases, "volume": volume_cases}[what](out_dir, arg)
