"""The MPI trainer stops and schedules as ksae-train does: SIGTERM to ``mpiexec`` stops every
rank after the same step with a checkpoint and exit status 143; a 1-epoch run trains at k."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.checkpoint import load_checkpoint

from test_distributed import MPIEXEC, REPO, _missing, dist_train

pytestmark = pytest.mark.skipif(_missing is not None, reason=str(_missing))
SMALL = ["--hidden", "16", "--k", "2", "--batch-size", "20"]


@pytest.fixture
def data_file(tmp_path):
    np.save(tmp_path / "x.npy", make_sparse_signals(400, D=8, H=16, k=2, seed=0)[0])
    return tmp_path / "x.npy"


def test_a_one_epoch_run_notes_the_short_schedule_and_trains_at_k(data_file, tmp_path):
    proc = dist_train(2, [str(data_file), *SMALL, "--epochs", "1", "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert "never reach k 2; training with k 2 from the start" in proc.stdout
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["k"] == 2


def test_sigterm_stops_every_rank_with_a_checkpoint_and_status_143(data_file, tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([str(MPIEXEC), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "ksae_cupy.cli.mpi_train",
                             "train", str(data_file), *SMALL, "--epochs", "3000", "--checkpoint-every", "1000",
                             "--run-dir", str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path)
    for line in proc.stdout:
        if line.startswith("epoch 2/"):  # the event: two epochs done, far from the end
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "SIGTERM: stopping every rank after this step" in err and "Abort" not in err
    assert err.strip().splitlines()[-1].endswith(f"train --resume {run}")
    saved = load_checkpoint(run / "checkpoint.h5")
    assert 2 <= saved.epoch < 3000
