"""The MPI trainer stops and schedules as ksae-train does, through the real ``mpiexec -n 2``.

SIGTERM and Ctrl-C to ``mpiexec`` (which passes them on to every rank), and SIGHUP or SIGTERM sent
to the ranks themselves (as SLURM's ``scancel --signal`` does), stop every rank after the same step
with a checkpoint, the resume line and exit status 128 + the signal. The job is held still at an
epoch (tests/parallel/heldmpi.py) while it is signalled, so no test races the job's clock. A
1-epoch run trains at k.
"""
import json
import os
import signal

import numpy as np
import pytest

from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.checkpoint import load_checkpoint

from heldmpi import held_mpi_train, rank_pids, read_stderr_until, release, wait_until_held
from test_distributed import _missing, dist_train

pytestmark = pytest.mark.skipif(_missing is not None, reason=str(_missing))
SMALL = ["--hidden", "16", "--k", "2", "--batch-size", "20"]


@pytest.fixture
def data_file(tmp_path):
    np.save(tmp_path / "x.npy", make_sparse_signals(400, D=8, H=16, k=2, seed=0)[0])
    return tmp_path / "x.npy"


def test_a_one_epoch_run_notes_the_short_schedule_and_trains_at_k(data_file, tmp_path):
    proc = dist_train(2, [str(data_file), *SMALL, "--epochs", "1", "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert "never reach k 2; training with k 2 from the start" in proc.stdout
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert record["k"] == 2 and record["valid_loss"] > 0


@pytest.mark.parametrize("signum, to", [(signal.SIGTERM, "mpiexec"), (signal.SIGINT, "mpiexec"),
                                        (signal.SIGHUP, "ranks"), (signal.SIGTERM, "ranks")])
def test_a_stop_signal_stops_every_rank_with_a_checkpoint_and_128_plus_the_signal(data_file, tmp_path, signum, to):
    run = tmp_path / "run"
    proc = held_mpi_train(2, [str(data_file), *SMALL, "--epochs", "3000", "--checkpoint-every", "1000",
                              "--run-dir", str(run)], tmp_path, epoch=2)
    assert wait_until_held(proc) == 2
    for pid in rank_pids(proc) if to == "ranks" else [proc.pid]:
        os.kill(pid, signum)
    name = signal.Signals(signum).name
    # The event: rank 0's handler has the signal (it says so) while the job is still held.
    err = read_stderr_until(proc, f"{name}: stopping every rank after this step and saving a checkpoint")
    _, rest = release(proc)
    err += rest
    assert proc.returncode == 128 + signum, err
    assert "Abort" not in err and "error" not in err
    assert err.strip().splitlines()[-1].endswith(f"train --resume {run}")
    saved = load_checkpoint(run / "checkpoint.h5")
    assert 2 <= saved.epoch < 3000
    assert (run / ".lock").read_text() == ""  # released: a resume says nothing of a stale lock
    resumed = dist_train(2, ["--resume", str(run), "--epochs", str(saved.epoch + 1)], cwd=tmp_path)
    assert "took over" not in resumed.stderr and f"done: {saved.epoch + 1} epochs" in resumed.stdout


# The MPI job, rank 0 holding inside its nth step (the others wait for it in the step's all-reduce) until its
# stdin is closed: a stop signal sent then lands inside an epoch, an event and not a clock.
HOLD_IN_STEP = """\
import sys
from mpi4py import MPI
from ksae_cupy.parallel.data_parallel import DataParallelTrainer
from ksae_cupy.parallel.sharded_hidden import ShardedHiddenTrainer

nth, calls = int(sys.argv.pop(1)), []


def holding(gradients):
    def step(self, X_nd, k, *rest):
        calls.append(k)
        if len(calls) == nth:
            print(f"held in step {nth}", flush=True)
            sys.stdin.read()
        return gradients(self, X_nd, k, *rest)
    return step


if MPI.COMM_WORLD.rank == 0:
    for cls in (DataParallelTrainer, ShardedHiddenTrainer):
        cls._batch_gradients = holding(cls._batch_gradients)
from ksae_cupy.cli.mpi_train import run

run(sys.argv[1:])
"""


@pytest.mark.parametrize("sharding", [[], ["--shard-hidden"]])
def test_a_job_stopped_inside_an_epoch_logs_that_epoch_as_an_uninterrupted_job_does(data_file, tmp_path, sharding):
    """SIGINT inside epoch 2 (after its 4th step), then --resume: every statistic of every epoch line (the
    loss, the validation loss, dead units, FVE, L0) is the uninterrupted job's; the parameters too."""
    import subprocess
    import sys

    from heldmpi import MPIEXEC, mpi_env

    # 64 units, k 2: units go dead, so counts that miss the batches before the stop would show
    args = [str(data_file), "--hidden", "64", "--k", "2", "--k-start", "4", "--batch-size", "20", "--epochs", "3",
            "--checkpoint-every", "1000", *sharding]
    dist_train(2, [*args, "--run-dir", str(tmp_path / "straight"), "--quiet"], cwd=tmp_path)

    def statistics(run):
        clocks = {"seconds", "samples_per_s", "parts", "time"}
        return [{key: value for key, value in json.loads(line).items() if key not in clocks}
                for line in (run / "metrics.jsonl").read_text().splitlines()]

    straight = statistics(tmp_path / "straight")
    per_epoch = straight[0]["step"]
    proc = subprocess.Popen([str(MPIEXEC), "-n", "2", sys.executable, "-m", "mpi4py", "-c", HOLD_IN_STEP,
                             str(per_epoch + 4), "train", *args, "--run-dir", str(tmp_path / "stopped")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=mpi_env(), cwd=tmp_path)
    for line in proc.stdout:
        if line.startswith("held in step"):
            break
    else:
        raise AssertionError(f"the job ended without holding: {proc.stderr.read()}")
    proc.send_signal(signal.SIGINT)  # mpiexec passes it on to every rank
    read_stderr_until(proc, "SIGINT: stopping every rank after this step and saving a checkpoint")
    _, err = release(proc)
    assert proc.returncode == 128 + signal.SIGINT, err
    saved = load_checkpoint(tmp_path / "stopped" / "checkpoint.h5")
    assert (saved.epoch, saved.batch_in_epoch) == (1, 4) and saved.epoch_tally is not None
    dist_train(2, ["--resume", str(tmp_path / "stopped"), "--quiet"], cwd=tmp_path)
    assert statistics(tmp_path / "stopped") == straight
    assert straight[1]["l0"] is not None and straight[1]["fve"] is not None
    a, b = (load_checkpoint(tmp_path / run / "checkpoint.h5") for run in ("stopped", "straight"))
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
