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
