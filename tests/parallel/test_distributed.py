"""Multi-process training under ``mpiexec`` (mpich wheel's launcher next to sys.executable).

Every MPI job runs as a subprocess with a time-out, so a hang fails the test instead of
blocking the suite; the time-out (600 s) is a hang guard only, far above what a job takes on a
2-core machine with two busy loops beside it. Skipped, with the reason shown, when mpi4py or mpiexec is missing.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ksae_cupy import model
from ksae_cupy.backend import CPU
from ksae_cupy.training.checkpoint import load_checkpoint
from ksae_cupy.topk import topk_sort
from ksae_cupy.training.trainer import TrainConfig, Trainer

from heldmpi import HANG_GUARD_S, MPIEXEC, REPO, mpi_env
WORKER = Path(__file__).with_name("dist_worker.py")

try:
    import mpi4py  # noqa: F401
    _missing = None if MPIEXEC.exists() else f"no mpiexec next to {sys.executable} (pip install mpich)"
except ImportError:
    _missing = "mpi4py is not installed (pip install 'ksae-cupy[mpi]')"
pytestmark = pytest.mark.skipif(_missing is not None, reason=str(_missing))


def mpirun(n, args, timeout=HANG_GUARD_S, cwd=None, check=True):
    """Run ``mpiexec -n N python ...`` with a hang guard; return the CompletedProcess."""
    # The repository, after what the test put first (the CuPy stand-in's folder for --device gpu).
    proc = subprocess.run([str(MPIEXEC), "-n", str(n), sys.executable, *args], cwd=cwd, env=mpi_env(),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"mpiexec failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def dist_train(n, args, cwd, **kw):
    return mpirun(n, ["-m", "mpi4py", "-m", "ksae_cupy.cli.mpi_train", "train", *args], cwd=cwd, **kw)


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-12), ("float32", 1e-5)])
def test_one_step_matches_single_process(tmp_path, dtype, rtol):
    """2 ranks x 32 examples == one process x 64 examples, and both ranks hold the same bits.

    Tolerance: the step from zero velocity is -lr * grad, and the gradient is a sum over
    the batch; splitting it into two partial sums and adding them changes only the
    summation order (plus one scaling by 1/2, exact in binary), so the difference is a few
    units in the last place of the largest partial sums: relative to the step's largest
    entry, well under 1e-5 in float32 (eps 6e-8, 64 terms) and 1e-12 in float64.
    """
    mpirun(2, [str(WORKER), "step", str(tmp_path), dtype])
    ranks = [np.load(tmp_path / f"step_{dtype}_rank{r}.npz") for r in range(2)]
    X = np.random.default_rng(1).standard_normal((64, 12)).astype(dtype)
    cfg = TrainConfig(hidden=20, k=3, k_start=None, epochs=1, batch_size=64, dtype=dtype, seed=5)
    single = Trainer(cfg, CPU, 12)
    start = {n: v.copy() for n, v in single.params.items()}
    single.run_epoch(X)
    for name in model.PARAM_NAMES:
        assert np.array_equal(ranks[0][name], ranks[1][name]), f"{name} differs between ranks"
        step = single.params[name] - start[name]
        diff = np.abs(ranks[0][name] - single.params[name]).max()
        assert diff <= rtol * np.abs(step).max(), (name, diff, np.abs(step).max())


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("method", ["threshold", "gather"])
def test_sharded_topk_is_the_single_process_support(tmp_path, n, method):
    mpirun(n, [str(WORKER), "topk", str(tmp_path), method])
    results = np.load(tmp_path / f"topk_{method}_{n}.npz")
    names = [key for key in results.files if not key.endswith("_Z")]
    assert len(names) == 12
    for key in names:
        Z, keep = results[key + "_Z"], results[key]
        k = int(key.rsplit("_k", 1)[1])
        idx, _ = topk_sort(Z, k)
        expected = np.zeros_like(keep)
        np.put_along_axis(expected, idx.astype(np.int64), True, axis=1)
        assert (keep.sum(axis=1) == k).all(), key
        assert np.array_equal(keep, expected), key


@pytest.mark.parametrize("n", [2, 3])
def test_bytes_passed_to_mpi_equal_the_formulas(tmp_path, n):
    """CountingComm on real collectives == commvolume's formulas, for both top-k methods
    (float32 and float64, uneven blocks, k above a block's width) and the data-parallel step."""
    mpirun(n, [str(WORKER), "volume", str(tmp_path), "-"])
    result = json.loads((tmp_path / f"volume_{n}.json").read_text())
    assert result["checked"] == n * 17
    assert result["mismatches"] == []


def test_bench_dist_validates_times_and_writes_results(tmp_path):
    """ksae-bench dist on tiny shapes: one MPI job per rank count, JSON + Markdown written."""
    from click.testing import CliRunner

    from ksae_cupy.cli.bench import bench_command

    out = CliRunner().invoke(bench_command, [
        "dist", "--ranks", "1,2", "--baseline-threads", "0", "--hidden", "40", "--dim", "12", "--batch-size", "16",
        "--k", "3", "--topk-k", "3,30", "--formula-ranks", "1,2,4", "--repeats", "1", "--steps", "2",
        "--topk-repeats", "1", "--timeout", str(HANG_GUARD_S), "--mpiexec", str(MPIEXEC), "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    [path] = tmp_path.glob("dist-cpu-*.json")
    result = json.loads(path.read_text())
    assert [job["ranks"] for job in result["jobs"]] == [1, 2]
    two = result["jobs"][1]
    assert two["validation"]["replicas_bit_identical"] and two["validation"]["dp_grad_max_rel_diff"] <= 1e-5
    assert two["validation"]["dp_allreduce_bytes_counted"] == (12 * 40 + 40 + 12 + 1) * 4
    assert len(two["data_parallel"]["allreduce_in_step_ms_per_rank"]) == 2
    assert {(r["method"], r["k"]) for r in two["sharded_topk"]} == {(m, k) for m in ("threshold", "gather") for k in (3, 30)}
    assert len(result["topk_formula"]) == 2 * 3 * 2 and result["meta"]["device"] == "cpu"
    assert "| 2 x 1 |" in path.with_suffix(".md").read_text()


def test_bench_dist_rejects_bad_values(tmp_path):
    from click.testing import CliRunner

    from ksae_cupy.cli.bench import bench_command

    out = CliRunner().invoke(bench_command, ["dist", "--ranks", "2,0", "--out", str(tmp_path)])
    assert out.exit_code == 2 and "--ranks '2,0' is not allowed" in out.output
    out = CliRunner().invoke(bench_command, ["dist", "--hidden", "10", "--topk-k", "25", "--out", str(tmp_path)])
    assert out.exit_code == 2 and "top-k k=[25] are not allowed for H=10" in out.output


def _data(tmp_path):
    X = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    return "x.npy"


COMMON = ["--hidden", "32", "--k", "4", "--batch-size", "32", "--lr", "0.01", "--quiet"]  # ksae-train on a file defaults to --lr auto


def _losses(run):
    return [json.loads(line)["valid_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_distributed_run_converges_checkpoints_on_rank0_and_resumes(tmp_path):
    data = _data(tmp_path)
    from ksae_cupy.cli.train import train_command
    from click.testing import CliRunner

    single = CliRunner().invoke(train_command, [str(tmp_path / data), *COMMON, "--epochs", "6", "--device", "cpu",
                                                "--run-dir", str(tmp_path / "single")])
    assert single.exit_code == 0, single.output
    # 2 epochs, then resume to 6, on 2 ranks.
    dist_train(2, [data, *COMMON, "--epochs", "6", "--run-dir", "dist", "--checkpoint-every", "1",
                   "--fail-at-step", "18", "--fail-mode", "raise"], tmp_path, check=False)
    first = _losses(tmp_path / "dist")
    assert len(first) == 2  # the injected failure at step 18 stopped it after epoch 2 (9 steps each)
    assert load_checkpoint(tmp_path / "dist" / "checkpoint.h5").epoch == 2
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == [".lock", "checkpoint.h5", "config.json",
                                                                   "metrics.jsonl"]
    dist_train(2, ["--resume", "dist", "--quiet"], tmp_path)
    dist = _losses(tmp_path / "dist")
    ref = _losses(tmp_path / "single")
    assert len(dist) == 6 and dist[-1] < dist[0]
    # Same batches, same init: only summation order differs, so the curves agree closely.
    np.testing.assert_allclose(dist, ref, rtol=1e-4)
    ckpt = load_checkpoint(tmp_path / "dist" / "checkpoint.h5")
    assert ckpt.epoch == 6 and ckpt.config["world_size"] == 2
    bad = dist_train(3, ["--resume", "dist", "--quiet"], tmp_path, check=False)
    assert bad.returncode != 0 and "trained on 2 ranks" in bad.stderr


@pytest.mark.gpu
def test_nccl_run_on_gpus_matches_the_mpi_run_on_cpus(tmp_path, gpu_cupy):
    """--device gpu --comm nccl: the gradients summed over the ranks by NCCL (on a GPU, or the
    stand-in's communicator over the MPI ranks) give the CPU + MPI run's curve."""
    data = _data(tmp_path)
    dist_train(2, [data, *COMMON, "--epochs", "3", "--run-dir", "mpi", "--device", "cpu"], tmp_path)
    dist_train(2, [data, *COMMON, "--epochs", "3", "--run-dir", "nccl", "--device", "gpu", "--comm", "nccl"], tmp_path,
               timeout=HANG_GUARD_S)
    config = json.loads((tmp_path / "nccl" / "config.json").read_text())
    assert config["device"].startswith("gpu") and config["comm"] == "nccl"
    nccl, mpi = _losses(tmp_path / "nccl"), _losses(tmp_path / "mpi")
    assert len(nccl) == 3 and nccl[-1] < nccl[0]
    np.testing.assert_allclose(nccl, mpi, rtol=1e-4)  # float32 sums in another order only


def test_shard_hidden_run_matches_single_process(tmp_path):
    data = _data(tmp_path)
    from ksae_cupy.cli.train import train_command
    from click.testing import CliRunner

    single = CliRunner().invoke(train_command, [str(tmp_path / data), *COMMON, "--epochs", "3", "--device", "cpu",
                                                "--run-dir", str(tmp_path / "single")])
    assert single.exit_code == 0, single.output
    dist_train(3, [data, *COMMON, "--epochs", "3", "--run-dir", "sh", "--shard-hidden"], tmp_path)
    np.testing.assert_allclose(_losses(tmp_path / "sh"), _losses(tmp_path / "single"), rtol=1e-4)
    a = load_checkpoint(tmp_path / "sh" / "checkpoint.h5").params["W_dh"]
    b = load_checkpoint(tmp_path / "single" / "checkpoint.h5").params["W_dh"]
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_failing_rank_fails_the_job_without_hanging(tmp_path, mode):
    data = _data(tmp_path)
    proc = dist_train(2, [data, *COMMON, "--epochs", "50", "--run-dir", "r", "--fail-at-step", "3",
                          "--fail-mode", mode], tmp_path, check=False)
    assert proc.returncode != 0
    if mode == "raise":  # one line, MPICH's "Abort(1) on node 1 ..." silenced
        assert proc.stderr.strip() == "error: [rank 1] RuntimeError: injected failure on rank 1 at step 3"


def test_package_import_does_not_load_mpi():
    code = "import sys, ksae_cupy.parallel.data_parallel, ksae_cupy.parallel.sharded_topk, ksae_cupy.parallel.comm; print('mpi4py.MPI' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)),
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert out.stdout.strip() == "False", out.stderr
