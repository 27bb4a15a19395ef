"""kill -9 inside a checkpoint write, deterministically: the run is held halfway through writing its
checkpoint's bytes (tests/heldrun.py: half the file on the disk, flushed), killed there, and the folder
still resumes from the previous good checkpoint and ends as a run never interrupted. The other kill
tests wait for an epoch's line, so none of them is sure to land inside the write."""
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from heldrun import held_in_checkpoint_write, wait_until_held_in_write
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.errors import KsaeError
from ksae_cupy.training.checkpoint import load_checkpoint

TRAIN = [sys.executable, "-c", "from ksae_cupy.cli.train import train_command; train_command()"]
# Bit-identity on the CPU needs the same BLAS thread count in every run (sums are ordered by it).
ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONUNBUFFERED="1",
           **{name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})


@contextmanager
def killed_in_second_write(command: str, arguments: list[str]):
    """A run of ``ksae-<command> <arguments>`` held halfway through writing its second checkpoint, for
    the block; leaving it, the run gets a SIGKILL there (no handler, no cleanup runs) and must die of it."""
    proc = subprocess.Popen(held_in_checkpoint_write(2, command=command) + arguments, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert wait_until_held_in_write(proc) == 2
        yield
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


def test_kill_9_inside_a_checkpoint_write_resumes_from_the_previous_checkpoint(tmp_path):
    np.save(tmp_path / "x.npy", make_sparse_signals(400, D=16, H=32, k=3, seed=1)[0])
    common = [str(tmp_path / "x.npy"), "--hidden", "24", "--k", "3", "--no-k-schedule", "--epochs", "4",
              "--batch-size", "20", "--device", "cpu", "--checkpoint-every", "1", "--threads", "1"]
    run = tmp_path / "killed"
    with killed_in_second_write("train", common + ["--run-dir", str(run)]):  # epoch 2's: half its bytes on the disk
        good = (run / "checkpoint.h5").read_bytes()
        half = (run / "checkpoint.h5.tmp").read_bytes()
        assert 0 < len(half) and load_checkpoint(run / "checkpoint.h5").epoch == 1
    # What the kill left: the previous checkpoint whole, and the half-written temporary beside it.
    assert (run / "checkpoint.h5").read_bytes() == good
    assert (run / "checkpoint.h5.tmp").read_bytes() == half
    try:
        load_checkpoint(run / "checkpoint.h5.tmp")
        raise AssertionError("half a checkpoint loaded")
    except KsaeError:
        pass

    resumed = subprocess.run(TRAIN + ["--resume", str(run)], capture_output=True, text=True, env=ENV, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"removed {run / 'checkpoint.h5.tmp'}, left by a run that was stopped while writing it" in resumed.stderr
    assert f"resuming {run} after epoch 1" in resumed.stdout
    assert not list(run.glob("*.tmp"))

    straight = subprocess.run(TRAIN + common + ["--run-dir", str(tmp_path / "straight"), "--quiet"],
                              capture_output=True, text=True, env=ENV, timeout=300)
    assert straight.returncode == 0, straight.stderr
    a, b = load_checkpoint(run / "checkpoint.h5"), load_checkpoint(tmp_path / "straight" / "checkpoint.h5")
    assert (a.epoch, a.step) == (b.epoch, b.step) == (4, b.step)
    for group in ("params", "velocities"):
        for name, value in getattr(b, group).items():
            assert getattr(a, group)[name].tobytes() == value.tobytes(), f"{group}/{name} differs"


def test_kill_9_inside_a_finetune_checkpoint_write_resumes_from_the_previous_one(tmp_path):
    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint

    finetune = [sys.executable, "-c", "from ksae_cupy.cli.finetune import finetune_command; finetune_command()"]
    common = ["--no-pretraining", "--hidden", "32", "--k", "4", "--dataset", "synthetic", "--epochs", "3",
              "--batch-size", "500", "--checkpoint-every", "1", "--device", "cpu", "--lr-start", "0.1", "--lr-end",
              "0.01", "--threads", "1"]
    run = tmp_path / "killed"
    with killed_in_second_write("finetune", common + ["--run-dir", str(run)]):
        good = (run / "checkpoint.h5").read_bytes()
    assert (run / "checkpoint.h5").read_bytes() == good and (run / "checkpoint.h5.tmp").exists()
    assert load_finetune_checkpoint(run / "checkpoint.h5")["epoch"] == 1

    resumed = subprocess.run(finetune + ["--resume", str(run)], capture_output=True, text=True, env=ENV, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert not list(run.glob("*.tmp"))
    straight = subprocess.run(finetune + common + ["--run-dir", str(tmp_path / "straight"), "--quiet"],
                              capture_output=True, text=True, env=ENV, timeout=300)
    assert straight.returncode == 0, straight.stderr
    a = load_finetune_checkpoint(run / "checkpoint.h5")
    b = load_finetune_checkpoint(tmp_path / "straight" / "checkpoint.h5")
    assert (a["phase_index"], a["epoch"], a["step"]) == (b["phase_index"], b["epoch"], b["step"])
    for group in ("params", "velocities"):
        for name, value in b[group].items():
            assert a[group][name].tobytes() == value.tobytes(), f"{group}/{name} differs"
