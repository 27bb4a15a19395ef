"""Faults that must lose nothing: a checkpoint write that fails midway (full disk), a
``kill -9`` after a logged epoch (often mid-write) followed by ``--resume``, and the
temporary file such a kill can leave behind."""
import errno
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import ksae_cupy.training.checkpoint as checkpoint
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.checkpoint import load_checkpoint
from clicheck import assert_one_line_error
from heldrun import held_train, wait_until_held

QUICK = ["--hidden", "16", "--k", "2", "--k-start", "4", "--batch-size", "10", "--device", "cpu"]
TRAIN = [sys.executable, "-c", "from ksae_cupy.cli.train import train_command; train_command()"]
# Bit-identity on the CPU needs the same BLAS thread count in every run (sums are ordered by it).
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


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


def test_a_full_disk_under_the_checkpoint_file_itself_is_one_line(tmp_path, monkeypatch):
    """The disk fills while the checkpoint's bytes go to ``checkpoint.h5.tmp`` (the HDF5 file is built
    in memory, then written by plain I/O): one line with the reason, the previous checkpoint kept."""
    import builtins

    real_open, writes = builtins.open, []

    class FillsUp:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(bytes(data[:100]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def open_that_fills_on_the_second_checkpoint(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        if str(path).endswith("checkpoint.h5.tmp") and "w" in mode:
            writes.append(path)
            if len(writes) >= 2:
                return FillsUp(f)
        return f

    monkeypatch.setattr(checkpoint, "open", open_that_fills_on_the_second_checkpoint, raising=False)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(train_command, [str(_data(tmp_path)), *QUICK, "--epochs", "3",
                                                "--checkpoint-every", "1", "--run-dir", str(run_dir)])
    assert_one_line_error(result, f"could not write {run_dir / 'checkpoint.h5'} (No space left on device)",
                          "previous checkpoint.h5 is intact", status=2)
    assert load_checkpoint(run_dir / "checkpoint.h5").epoch == 1
    assert not (run_dir / "checkpoint.h5.tmp").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 32 KiB tmpfs (room for one small checkpoint, not two): needs root and permission to mount."""
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    place = tmp_path / "small"
    place.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(place)], capture_output=True).returncode:
        pytest.skip("not allowed to mount a tmpfs here")
    try:
        yield place
    finally:
        subprocess.run(["umount", "-l", str(place)], capture_output=True)


def test_a_real_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, small_disk):
    """On a real full disk HDF5 writing its file directly failed in its cache, then h5py's close
    raised (a RuntimeError traceback) or the interpreter crashed (segmentation fault, status 139)."""
    run_dir = small_disk / "run"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), **ONE_THREAD)
    proc = subprocess.run(TRAIN + [str(_data(tmp_path)), *QUICK, "--epochs", "5", "--checkpoint-every", "1",
                                   "--run-dir", str(run_dir), "--quiet"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"error: could not write {run_dir / 'checkpoint.h5'} (No space left on "
                                        f"device); the previous checkpoint.h5 is intact; free space or fix the "
                                        f"folder, then continue the run with: ksae-train --resume {run_dir}"], proc.stderr
    assert 1 <= load_checkpoint(run_dir / "checkpoint.h5").epoch < 5
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


KILL_EPOCHS = 60


def kill_seed() -> int:
    """The seed of the kill's moment: ``KSAE_KILL_SEED`` replays a failure, else a fresh one."""
    return int(os.environ.get("KSAE_KILL_SEED") or random.randrange(2**32))


def test_kill_9_after_a_logged_epoch_then_resume_is_bit_identical(tmp_path):
    """SIGKILL (no handler runs) as soon as the run logs epoch N (N drawn from the seed), which is
    often while it writes that epoch's checkpoint; then ``--resume`` ends with the parameters of a
    run that was never interrupted.

    The kill waits for an event, not a clock: the run holds after logging epoch N (tests/heldrun.py).
    N is at least 2 (a checkpoint exists) and at most a third of the epochs, so the run is far from its
    end when it is let go and killed.
    """
    seed = kill_seed()
    print(f"kill seed {seed} (replay: KSAE_KILL_SEED={seed})")
    # From epoch 2 on: epoch N's line comes after epoch N-1's checkpoint was written, so there is one.
    kill_after = random.Random(seed).randint(2, KILL_EPOCHS // 3)
    np.save(tmp_path / "x.npy", make_sparse_signals(1000, D=32, H=64, k=4, seed=3)[0])
    common = [str(tmp_path / "x.npy"), "--hidden", "48", "--k", "4", "--epochs", str(KILL_EPOCHS), "--batch-size",
              "20", "--device", "cpu", "--checkpoint-every", "1", "--progress-seconds", "1000"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONUNBUFFERED="1", **ONE_THREAD)
    replay = f"seed {seed} (kill after epoch {kill_after}; replay with KSAE_KILL_SEED={seed})"

    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(held_train(kill_after) + common + ["--run-dir", str(run_dir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    wait_until_held(proc)  # the run holds after logging epoch N
    # Let it go and kill it at once: the kill lands at a moment nobody chose, just after epoch N (often
    # while that epoch's checkpoint is written). The run could end first only if this process lost the
    # CPU between two system calls for all the epochs left, not while waking up from a read as before.
    proc.stdin.close()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, f"{replay}: the run ended with status {proc.returncode} before the kill"
    killed_at = load_checkpoint(run_dir / "checkpoint.h5").epoch
    assert kill_after - 1 <= killed_at < KILL_EPOCHS, replay

    resumed = subprocess.run(TRAIN + ["--resume", str(run_dir), "--device", "cpu", "--quiet"], capture_output=True,
                             text=True, env=env, timeout=300)
    assert resumed.returncode == 0, f"{replay}: {resumed.stderr}"
    straight = subprocess.run(TRAIN + common + ["--run-dir", str(tmp_path / "straight"), "--quiet"],
                              capture_output=True, text=True, env=env, timeout=300)
    assert straight.returncode == 0, straight.stderr
    a, b = load_checkpoint(run_dir / "checkpoint.h5"), load_checkpoint(tmp_path / "straight" / "checkpoint.h5")
    assert (a.epoch, a.step) == (b.epoch, b.step) == (KILL_EPOCHS, b.step), replay
    for group in ("params", "velocities"):
        for name, value in getattr(b, group).items():
            assert getattr(a, group)[name].tobytes() == value.tobytes(), f"{replay}: {group}/{name} differs " \
                                                                        f"after a kill at epoch {killed_at}"
    assert not list(run_dir.glob("*.tmp"))
