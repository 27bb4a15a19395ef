"""Faults that must lose nothing: a checkpoint write that fails midway (full disk), a
``kill -9`` at a random moment followed by ``--resume``, and the temporary file such a
kill can leave behind."""
import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from click.testing import CliRunner

import ksae_cupy.training.checkpoint as checkpoint
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.checkpoint import load_checkpoint
from clicheck import assert_one_line_error

QUICK = ["--hidden", "16", "--k", "2", "--k-start", "4", "--batch-size", "10", "--device", "cpu"]


def _data(tmp_path, n=200):
    path = tmp_path / "x.npy"
    np.save(path, make_sparse_signals(n, D=8, H=16, k=2, seed=0)[0])
    return path


def test_full_disk_during_a_checkpoint_keeps_the_previous_one_and_stops_in_one_line(tmp_path, monkeypatch):
    real_writer, calls, before = checkpoint.write_hdf5_atomically, [], {}

    def disk_fills_on_second_write(path, write_fn, verify_fn):
        calls.append(path)
        if len(calls) < 2:
            return real_writer(path, write_fn, verify_fn)
        before["bytes"] = Path(path).read_bytes()

        def half_then_enospc(f):  # some data reaches the temporary file, then the disk is full
            f.create_group("params").create_dataset("W_dh", data=np.zeros((8, 16), np.float32))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path) + ".tmp")

        return real_writer(path, half_then_enospc, verify_fn)

    monkeypatch.setattr(checkpoint, "write_hdf5_atomically", disk_fills_on_second_write)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(train_command, [str(_data(tmp_path)), *QUICK, "--epochs", "3",
                                                "--checkpoint-every", "1", "--run-dir", str(run_dir)])
    assert_one_line_error(result, "No space left on device", "previous checkpoint.h5 is intact", "--resume",
                          status=2)
    assert len(calls) == 2
    assert (run_dir / "checkpoint.h5").read_bytes() == before["bytes"]
    assert load_checkpoint(run_dir / "checkpoint.h5").epoch == 1
    assert not (run_dir / "checkpoint.h5.tmp").exists()


def test_a_leftover_temporary_checkpoint_is_removed_at_the_next_start(tmp_path):
    data, run_dir = _data(tmp_path), tmp_path / "run"
    first = CliRunner().invoke(train_command, [str(data), *QUICK, "--epochs", "2", "--run-dir", str(run_dir)])
    assert first.exit_code == 0, first.output
    kept = (run_dir / "checkpoint.h5").read_bytes()
    (run_dir / "checkpoint.h5.tmp").write_bytes(b"half a checkpoint, as kill -9 leaves it")
    again = CliRunner().invoke(train_command, ["--resume", str(run_dir), "--device", "cpu"])
    assert again.exit_code == 0, again.output
    said = [line for line in again.stderr.splitlines() if "checkpoint.h5.tmp" in line]
    assert len(said) == 1 and said[0].startswith("removed "), again.stderr
    assert not (run_dir / "checkpoint.h5.tmp").exists()
    assert (run_dir / "checkpoint.h5").read_bytes() == kept  # a finished run resumed trains nothing


TRAIN = [sys.executable, "-c", "from ksae_cupy.cli.train import train_command; train_command()"]
# Bit-identity on the CPU needs the same BLAS thread count in every run (sums are ordered by it).
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def test_kill_9_at_a_random_moment_then_resume_is_bit_identical(tmp_path):
    """SIGKILL (no handler runs) somewhere after the first checkpoint, even mid-write; then
    ``--resume`` ends with the parameters of a run that was never interrupted."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    np.save(tmp_path / "x.npy", make_sparse_signals(3000, D=32, H=64, k=4, seed=3)[0])
    common = [str(tmp_path / "x.npy"), "--hidden", "48", "--k", "4", "--epochs", "30", "--batch-size", "20",
              "--device", "cpu", "--checkpoint-every", "1", "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), **ONE_THREAD)

    started = time.monotonic()
    straight = subprocess.run(TRAIN + common + ["--run-dir", str(tmp_path / "straight")], capture_output=True,
                              text=True, env=env, timeout=300)
    assert straight.returncode == 0, straight.stderr
    duration = time.monotonic() - started

    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(TRAIN + common + ["--run-dir", str(run_dir)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    while not (run_dir / "checkpoint.h5").exists() and proc.poll() is None:
        time.sleep(0.005)
    delay = rng.uniform(0.0, 0.5 * duration)  # well before the end: the kill must interrupt training
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"seed {seed}: the run ended before the kill ({delay:.2f} s)"
    killed_at = load_checkpoint(run_dir / "checkpoint.h5").epoch
    assert killed_at < 30, f"seed {seed}"

    resumed = subprocess.run(TRAIN + ["--resume", str(run_dir), "--device", "cpu", "--quiet"], capture_output=True,
                             text=True, env=env, timeout=300)
    assert resumed.returncode == 0, f"seed {seed}: {resumed.stderr}"
    a, b = load_checkpoint(run_dir / "checkpoint.h5"), load_checkpoint(tmp_path / "straight" / "checkpoint.h5")
    assert (a.epoch, a.step) == (b.epoch, b.step) == (30, b.step), f"seed {seed}"
    for group in ("params", "velocities"):
        for name, value in getattr(b, group).items():
            assert getattr(a, group)[name].tobytes() == value.tobytes(), f"seed {seed}: {group}/{name} differs " \
                                                                        f"after a kill at epoch {killed_at}"
    assert not list(run_dir.glob("*.tmp"))
