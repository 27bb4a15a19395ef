"""``ksae-bench dist``: data-parallel step and all-reduce times, and the sharded top-k's traffic.

    ksae-bench dist --ranks 1,2,3 --repeats 7 --steps 20

The command is an ordinary process; it launches one MPI job per configuration,

    mpiexec -n R python -m mpi4py -m ksae_cupy.bench.distributed SPEC.json RESULT.json

and gathers their results into one JSON file (with :func:`~ksae_cupy.bench.metadata.run_metadata`)
and a Markdown summary beside it. Each job validates before it times:

* one data-parallel step's all-reduced gradient equals the single-process gradient of the
  same global batch within 1e-5 of its largest entry (float32; only the summation order
  differs), and after the step every rank holds the same bits;
* both sharded top-k methods select exactly the single-process top-k of every row;
* the bytes :class:`~ksae_cupy.parallel.commvolume.CountingComm` counts equal the formulas of
  :mod:`ksae_cupy.parallel.commvolume`, for the step's all-reduce and for both top-k methods.

Then it times, with the median over repeats:

* (R = 1 only) the plain single-process :class:`~ksae_cupy.training.trainer.Trainer` step;
* the :class:`~ksae_cupy.parallel.data_parallel.DataParallelTrainer` step, split into the time inside
  the gradient all-reduce (which includes waiting for the slowest rank) and the rest
  (compute: forward, backward, packing, optimiser); and the same all-reduce alone, each
  call started after a barrier (the transfer without the wait);
* each sharded top-k method per call, after a barrier, the slowest rank's time.

Shapes are MNIST's (D = 784, H = 1000, batch 128, k = 25) on synthetic uniform data: the
step's cost does not depend on the pixel values.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ksae_cupy import paper
from ksae_cupy.errors import KsaeError, OptionError, literal

DP_TOLERANCE = 1e-5  # float32 gradient, relative to its largest entry (see tests/test_distributed.py)


# -- inside each MPI job ----------------------------------------------------------------

def run_job(spec: dict) -> dict | None:
    """Validate, then time, on every rank of ``MPI.COMM_WORLD``; rank 0 returns the results."""
    import mpi4py
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    D, H, N, k = spec["D"], spec["H"], spec["N"], spec["k"]
    rng = np.random.default_rng(spec["seed"])
    X_train_nd = rng.random((N * spec["steps"], D), dtype=np.float32)  # the same on every rank
    result = {"ranks": comm.size, "threads_per_rank": spec["threads"], "mpi4py": mpi4py.__version__,
              "mpi_library": MPI.Get_library_version().strip().splitlines()[0]}
    result["validation"] = _validate_dp(comm, X_train_nd[:N], D, H, k)
    if comm.size == 1:
        result["single_process"] = _time_single(X_train_nd, D, H, N, k, spec)
    result["data_parallel"] = _time_dp(comm, X_train_nd, D, H, N, k, spec)
    if spec["topk"]:
        result["sharded_topk"] = _bench_topk(comm, X_train_nd[:N], D, H, spec)
    return result if comm.rank == 0 else None


def _config(H, N, k):
    from ksae_cupy.training.trainer import TrainConfig

    # lr small: the timed epochs on random data must not diverge; it does not change the cost.
    return TrainConfig(hidden=H, k=k, k_start=None, epochs=10**6, batch_size=N, lr=1e-3, dtype="float32", seed=0)


def _validate_dp(comm, X_nd, D, H, k) -> dict:
    """One data-parallel step's summed gradient against the single-process gradient of the
    same batch, the ranks' parameters bit for bit, and the bytes counted against the formula.

    Gradients, not parameters, are compared: with a small lr one float32 rounding of W
    is already ~1e-5 of the update, and would hide the quantity under test.
    """
    from ksae_cupy import model
    from ksae_cupy.backend import CPU
    from ksae_cupy.parallel.comm import MPIAllreducer
    from ksae_cupy.parallel.commvolume import CountingComm, dp_allreduce_volume
    from ksae_cupy.parallel.data_parallel import DataParallelTrainer

    N = X_nd.shape[0]
    counting = CountingComm(comm)
    dp = DataParallelTrainer(_config(H, N, k), CPU, D, comm, MPIAllreducer(counting))
    start = {name: value.copy() for name, value in dp.params.items()}
    dp.run_epoch(X_nd)  # N rows, batch N: one step; dp.grads keeps its all-reduced gradient
    dp.check_replicas_agree()
    _, single, _ = model.loss_and_grads(start, X_nd, k, "sort")
    worst = max(float(np.abs(dp.grads.views[n] - single[n]).max() / np.abs(single[n]).max()) for n in single)
    if worst > DP_TOLERANCE:
        raise KsaeError(f"benchmark validation failed: the {comm.size}-rank gradient differs from the single-process "
                        f"gradient by {worst:.2e} of its largest entry (allowed {DP_TOLERANCE})")
    counted, formula = counting.volume(), dp_allreduce_volume(D, H, comm.size)
    if counted != formula:
        raise KsaeError(f"benchmark validation failed: the step passed {counted} to MPI, the formula says {formula}")
    return {"dp_grad_max_rel_diff": worst, "replicas_bit_identical": True,
            "dp_allreduce_bytes_counted": counted.sent, "dp_allreduce_bytes_formula": formula.sent}


class TimedAllreduce:
    """Wraps an all-reducer and adds up the seconds spent inside it."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def __call__(self, flat):
        start = time.perf_counter()
        out = self.inner(flat)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out


def _time_single(X_train_nd, D, H, N, k, spec) -> dict:
    """The plain Trainer: the step time with nothing distributed."""
    from ksae_cupy.backend import CPU
    from ksae_cupy.training.trainer import Trainer

    trainer = Trainer(_config(H, N, k), CPU, D)
    trainer.run_epoch(X_train_nd)  # warm-up
    steps_ms = [trainer.run_epoch(X_train_nd).seconds / spec["steps"] * 1e3 for _ in range(spec["repeats"])]
    return {"step_ms": statistics.median(steps_ms), "step_ms_repeats": steps_ms}


def _time_dp(comm, X_train_nd, D, H, N, k, spec) -> dict:
    """Data-parallel step time, the all-reduce's share of it, and the bare all-reduce."""
    from mpi4py import MPI

    from ksae_cupy.backend import CPU
    from ksae_cupy.parallel.comm import MPIAllreducer
    from ksae_cupy.parallel.data_parallel import DataParallelTrainer

    timed = TimedAllreduce(MPIAllreducer(comm))
    trainer = DataParallelTrainer(_config(H, N, k), CPU, D, comm, timed)
    trainer.run_epoch(X_train_nd)  # warm-up
    step_ms, allreduce_ms = [], []
    for _ in range(spec["repeats"]):
        timed.seconds, timed.calls = 0.0, 0
        comm.Barrier()
        report = trainer.run_epoch(X_train_nd)
        step_ms.append(report.seconds / spec["steps"] * 1e3)
        allreduce_ms.append(timed.seconds / timed.calls * 1e3)
    trainer.check_replicas_agree()
    # The same all-reduce alone: a barrier before each call removes most of the waiting.
    flat = np.zeros_like(trainer.grads.flat)  # zeros: repeated sums stay finite
    bare_ms = []
    for _ in range(spec["repeats"] * 3):
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        bare_ms.append((time.perf_counter() - start) * 1e3)
    mine = {"step_ms": statistics.median(step_ms), "allreduce_in_step_ms": statistics.median(allreduce_ms),
            "bare_allreduce_ms": statistics.median(bare_ms)}
    mine["compute_ms"] = mine["step_ms"] - mine["allreduce_in_step_ms"]
    per_rank = comm.gather(mine, root=0)
    if comm.rank != 0:
        return {}
    return {
        "flat_floats": int(flat.size), "flat_bytes": int(flat.nbytes),
        "step_ms": max(r["step_ms"] for r in per_rank),  # the ranks move in lockstep; the slowest sets it
        "compute_ms_per_rank": [r["compute_ms"] for r in per_rank],
        "allreduce_in_step_ms_per_rank": [r["allreduce_in_step_ms"] for r in per_rank],
        "bare_allreduce_ms": max(r["bare_allreduce_ms"] for r in per_rank),
        "samples_per_s": N / (max(r["step_ms"] for r in per_rank) / 1e3),
        "step_ms_repeats_rank0": step_ms,
    }


def _bench_topk(comm, X_nd, D, H, spec) -> list[dict]:
    """Both sharded top-k methods on this job's ranks: checked, bytes counted, timed."""
    from ksae_cupy.parallel.commvolume import CountingComm, topk_volume
    from ksae_cupy.parallel.comm import shard_bounds
    from ksae_cupy.parallel.sharded_topk import DIST_TOPK_METHODS, sharded_topk
    from ksae_cupy import model
    from ksae_cupy.topk import topk_sort

    # Realistic pre-activations: the initial model on the benchmark's data.
    params = model.init_params(D, H, 0.01, np.random.default_rng(spec["seed"]), np.float32)
    Z_nh = model.hidden_preactivations(params, X_nd)
    N = Z_nh.shape[0]
    lo, hi = shard_bounds(H, comm.size, comm.rank)
    Z_local = np.ascontiguousarray(Z_nh[:, lo:hi])
    rows = []
    for k in spec["topk_ks"]:
        idx_nk, _ = topk_sort(Z_nh, k)
        expected_nh = np.zeros(Z_nh.shape, dtype=bool)
        np.put_along_axis(expected_nh, idx_nk.astype(np.int64), True, axis=1)
        for method in DIST_TOPK_METHODS:
            counting = CountingComm(comm)
            keep = sharded_topk(Z_local, k, counting, lo, method)
            agree = comm.allgather(bool(np.array_equal(keep, expected_nh[:, lo:hi])))
            if not all(agree):
                raise KsaeError(f"benchmark validation failed: sharded top-k {method!r} (k={k}) differs from the "
                                f"single-process top-k on ranks {[r for r, ok in enumerate(agree) if not ok]}")
            counted, formula = counting.volume(), topk_volume(method, N, H, k, comm.size, comm.rank)
            if counted != formula:
                raise KsaeError(f"benchmark validation failed: {method!r} k={k} on rank {comm.rank} passed "
                                f"{counted} to MPI, the formula says {formula}")
            times = []
            for _ in range(spec["topk_repeats"]):
                comm.Barrier()
                start = time.perf_counter()
                sharded_topk(Z_local, k, comm, lo, method)
                times.append(time.perf_counter() - start)
            slowest = np.max(comm.allgather(times), axis=0)  # per repeat, the last rank to finish
            volumes = comm.gather(counted.to_dict(), root=0)
            rows.append({"method": method, "k": k, "N": N, "H": H, "ranks": comm.size,
                         "ms_per_call": float(np.median(slowest)) * 1e3,
                         "counted_per_rank": volumes, "equals_formula": True})
    return rows


# -- the launcher (an ordinary process) --------------------------------------------------

def find_mpiexec(given: str | None = None) -> str:
    """``mpiexec``: the given path, the one beside this Python (mpich wheel), or on PATH."""
    if given:
        if not Path(given).exists():
            raise OptionError("mpiexec", f"{{name}} {literal(given)}: no such file; give the path of mpiexec")
        return given
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        raise OptionError("mpiexec", "ksae-bench dist needs mpiexec and mpi4py; install them with "
                                     "pip install 'ksae-cupy[mpi]' or give {name} PATH")
    return found


def launch_job(mpiexec: str, ranks: int, threads: int, spec: dict, timeout: float) -> dict:
    """Run one MPI job of the benchmark and return rank 0's results."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(dict(spec, threads=threads)))
        command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "ksae_cupy.bench.distributed",
                   str(spec_path), str(result_path)]
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise OptionError("timeout", f"the {ranks}-rank benchmark job ran past {{name}} {timeout:g} s") from None
        if proc.returncode != 0 or not result_path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise KsaeError(f"the {ranks}-rank benchmark job failed ({proc.returncode}): " + " | ".join(tail))
        return json.loads(result_path.read_text())


def formula_table(N: int, H: int, ks, ranks) -> list[dict]:
    """Bytes per step of both top-k methods versus rank count, from the formulas (rank 0)."""
    from ksae_cupy.parallel.commvolume import topk_volume
    from ksae_cupy.parallel.sharded_topk import DIST_TOPK_METHODS

    return [dict(method=method, k=k, ranks=R, N=N, H=H, **topk_volume(method, N, H, k, R).to_dict())
            for k in ks for R in ranks if R <= H for method in DIST_TOPK_METHODS]


def bench_dist(*, ranks, threads=1, baseline_threads=0, D=784, H=paper.HIDDEN, N=paper.BATCH_SIZE, k=paper.K,
               topk_ks=(25, 250),
               formula_ranks=(1, 2, 4, 8, 16), repeats=7, steps=20, topk_repeats=21, seed=0, mpiexec=None,
               timeout=600.0, log=print) -> dict:
    """Run every configuration and return the combined results (with metadata)."""
    from ksae_cupy.bench.metadata import run_metadata
    from ksae_cupy.parallel.commvolume import dp_allreduce_volume

    if not 1 <= k <= H or any(not 1 <= kk <= H for kk in topk_ks):
        raise KsaeError(f"k={k} and top-k k={list(topk_ks)} are not allowed for H={H}; use 1 <= k <= H")
    mpiexec = find_mpiexec(mpiexec)
    # Other work on the machine slows every figure: record how busy it was before we started.
    load_before = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    spec = {"D": D, "H": H, "N": N, "k": k, "topk_ks": list(topk_ks), "repeats": repeats, "steps": steps,
            "topk_repeats": topk_repeats, "seed": seed}
    configs = [(R, threads, True) for R in ranks]
    if baseline_threads and baseline_threads != threads:
        configs.insert(1 if 1 in ranks else 0, (1, baseline_threads, False))
    jobs = []
    for R, t, with_topk in configs:
        log(f"{R} rank(s) x {t} thread(s): validating, then timing ...")
        job = launch_job(mpiexec, R, t, dict(spec, topk=with_topk), timeout)
        dp = job["data_parallel"]
        log(f"  step {dp['step_ms']:.2f} ms, all-reduce in step "
            f"{', '.join(f'{x:.2f}' for x in dp['allreduce_in_step_ms_per_rank'])} ms per rank, "
            f"bare all-reduce {dp['bare_allreduce_ms']:.2f} ms")
        jobs.append(job)
    return {
        "benchmark": "dist",
        "shape": {"N": N, "D": D, "H": H, "k": k, "dtype": "float32"},
        "mpiexec": mpiexec,
        "load_average_before": load_before,  # 1, 5, 15 minutes
        "repeats": repeats, "steps_per_repeat": steps, "topk_repeats": topk_repeats,
        "jobs": jobs,
        "dp_allreduce_bytes": dp_allreduce_volume(D, H, 2).sent,
        "topk_formula": formula_table(N, H, topk_ks, formula_ranks),
        "meta": run_metadata(),
    }


# -- the Markdown summary ----------------------------------------------------------------

def markdown(result: dict, note: str = "") -> str:
    """A short human-readable summary of :func:`bench_dist`'s result."""
    meta, shape = result["meta"], result["shape"]
    lines = [f"# Distributed benchmark ({meta['device']}, {meta['cpu_count']} cores, {meta['date']})", "",
             f"Commit {meta['commit']}, Python {meta['python']}, NumPy {meta['numpy']} ({meta['blas']}), "
             f"MPI via `{Path(result['mpiexec']).name}`. Shapes: N={shape['N']}, D={shape['D']}, H={shape['H']}, "
             f"k={shape['k']}, float32; median of {result['repeats']} repeats of {result['steps_per_repeat']} steps. "
             f"Load average (1, 5, 15 min) before the run: {result.get('load_average_before')}.", ""]
    if note:
        lines += [note, ""]
    single = next((j["single_process"]["step_ms"] for j in result["jobs"]
                   if "single_process" in j and j["threads_per_rank"] == 1), None)
    lines += ["## Data-parallel step (one all-reduce of "
              f"{result['jobs'][0]['data_parallel']['flat_floats']:,} floats = "
              f"{result['dp_allreduce_bytes'] / 1e6:.2f} MB per step)", "",
              "| ranks x threads | plain Trainer step ms | DP step ms | compute ms (per rank) | all-reduce in step ms "
              "(per rank) | bare all-reduce ms | samples/s | vs plain 1-thread |",
              "|---|---|---|---|---|---|---|---|"]
    for job in result["jobs"]:
        dp = job["data_parallel"]
        plain = job.get("single_process", {}).get("step_ms")
        speed = f"{single / dp['step_ms']:.2f}x" if single else "-"
        lines.append(f"| {job['ranks']} x {job['threads_per_rank']} | {f'{plain:.2f}' if plain else '-'} | "
                     f"{dp['step_ms']:.2f} | {' / '.join(f'{x:.2f}' for x in dp['compute_ms_per_rank'])} | "
                     f"{' / '.join(f'{x:.2f}' for x in dp['allreduce_in_step_ms_per_rank'])} | "
                     f"{dp['bare_allreduce_ms']:.2f} | {dp['samples_per_s']:,.0f} | {speed} |")
    measured = [row for job in result["jobs"] for row in job.get("sharded_topk", [])]
    if measured:
        lines += ["", "## Sharded top-k, measured (N=128, H=1000; bytes counted at rank 0 = formula)", "",
                  "| ranks | k | method | ms per call (slowest rank) | calls | sent B | received B |",
                  "|---|---|---|---|---|---|---|"]
        for row in sorted(measured, key=lambda r: (r["ranks"], r["k"], r["method"])):
            c = row["counted_per_rank"][0]
            lines.append(f"| {row['ranks']} | {row['k']} | {row['method']} | {row['ms_per_call']:.2f} | "
                         f"{c['calls']} | {c['sent']:,} | {c['received']:,} |")
    lines += ["", "## Sharded top-k, formula (rank 0; wire = estimated bytes a rank transmits)", "",
              "| k | ranks | threshold calls | threshold sent B | threshold wire B | gather calls | gather sent B | "
              "gather received B | gather wire B | fewer wire bytes |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    table = {(r["k"], r["ranks"], r["method"]): r for r in result["topk_formula"]}
    for k, R in sorted({(r["k"], r["ranks"]) for r in result["topk_formula"]}):
        t, g = table[(k, R, "threshold")], table[(k, R, "gather")]
        fewer = "-" if R == 1 else ("gather" if g["wire"] < t["wire"] else "threshold")
        lines.append(f"| {k} | {R} | {t['calls']} | {t['sent']:,} | {t['wire']:,.0f} | {g['calls']} | {g['sent']:,} | "
                     f"{g['received']:,} | {g['wire']:,.0f} | {fewer} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    """Entry point of one MPI job: ``python -m mpi4py -m ksae_cupy.bench.distributed SPEC.json RESULT.json``."""
    from ksae_cupy.parallel.agree import abort_on_error

    argv = sys.argv[1:] if argv is None else argv

    @abort_on_error
    def job():
        spec = json.loads(Path(argv[0]).read_text())
        result = run_job(spec)
        if result is not None:
            Path(argv[1]).write_text(json.dumps(result, indent=1))

    job()


if __name__ == "__main__":
    main()
