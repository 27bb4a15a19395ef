"""Checkpoints round-trip, fail clearly when damaged, and resume bit-identically on the CPU."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from ksae_cupy.training.checkpoint import load_checkpoint, save_checkpoint
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.errors import KsaeError
from ksae_cupy.training.estimator import KSparseAutoencoder
from heldrun import held_train, wait_until_held
from resumecheck import params_of, stop_at

X_nd, _, _ = make_sparse_signals(600, D=16, H=32, k=3, seed=1)
SETTINGS = dict(n_hidden=24, k=3, k_start=12, epochs=4, batch_size=50, device="cpu", seed=7)


def test_round_trip_keeps_every_array_and_attribute(tmp_path):
    model = KSparseAutoencoder(**SETTINGS).fit(X_nd)
    model.preprocess_ = {"mean_d": np.arange(16, dtype=np.float32)}
    model.save(tmp_path / "c.h5")
    ckpt = load_checkpoint(tmp_path / "c.h5")
    original = model.trainer_.checkpoint(model.preprocess_)
    for group in ("params", "velocities", "preprocess"):
        for name, value in getattr(original, group).items():
            np.testing.assert_array_equal(getattr(ckpt, group)[name], value)
            assert getattr(ckpt, group)[name].dtype == value.dtype
    assert (ckpt.epoch, ckpt.step, ckpt.config) == (4, 48, original.config)
    assert ckpt.rng_state == original.rng_state
    assert not (tmp_path / "c.h5.tmp").exists()


def test_stopped_mid_epoch_then_resumed_equals_uninterrupted(tmp_path):
    uninterrupted = KSparseAutoencoder(**SETTINGS).fit(X_nd)

    stopped = KSparseAutoencoder(**SETTINGS)
    stopped.fit(X_nd, on_batch=stop_at(stopped, epoch=1, batch=5), checkpoint_path=tmp_path / "c.h5")
    assert (stopped.trainer_.epoch, stopped.trainer_.batch_in_epoch) == (1, 5)
    resumed = KSparseAutoencoder.load(tmp_path / "c.h5", device="cpu").fit(X_nd)
    for name, value in params_of(uninterrupted).items():
        np.testing.assert_array_equal(params_of(resumed)[name], value)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong_format", "wrong_shape", "missing"])
def test_damaged_checkpoint_is_a_clear_error(tmp_path, damage):
    path = tmp_path / "c.h5"
    KSparseAutoencoder(**SETTINGS).fit(X_nd).save(path)
    if damage == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"not an hdf5 file at all")
    elif damage == "wrong_format":
        with h5py.File(path, "r+") as f:
            f.attrs["format_version"] = 99
    elif damage == "wrong_shape":
        with h5py.File(path, "r+") as f:
            del f["optim/b_h"]
            f["optim/b_h"] = np.zeros(5, dtype=np.float32)
    else:
        path.unlink()
    with pytest.raises(KsaeError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message


def test_failed_save_leaves_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "c.h5"
    model = KSparseAutoencoder(**SETTINGS).fit(X_nd)
    model.save(path)
    before = path.read_bytes()
    import ksae_cupy.training.checkpoint as checkpoint

    def broken_verify(p):
        raise KsaeError("simulated failure while verifying")

    monkeypatch.setattr(checkpoint, "load_checkpoint", broken_verify)
    with pytest.raises(KsaeError):
        save_checkpoint(path, model.trainer_.checkpoint())
    assert path.read_bytes() == before


TRAIN = [sys.executable, "-c", "from ksae_cupy.cli.train import train_command; train_command()"]


def test_ctrl_c_saves_and_resume_matches_uninterrupted_run(tmp_path):
    """A real SIGINT to ksae-train: exit 130, a checkpoint, and a resume that ends bit-identical."""
    np.save(tmp_path / "x.npy", make_sparse_signals(4000, D=32, H=64, k=4, seed=2)[0])
    common = [str(tmp_path / "x.npy"), "--hidden", "48", "--k", "4", "--epochs", "40", "--batch-size", "20",
              "--device", "cpu", "--checkpoint-every", "1000"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(held_train(2) + common + ["--run-dir", str(tmp_path / "a")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wait_until_held(proc)  # the run holds after epoch 2 (an event): Ctrl-C cannot come after its end
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)  # closes stdin: the run goes on and stops after its next step
    assert proc.returncode == 130, err
    assert "--resume" in err and (tmp_path / "a" / "checkpoint.h5").exists()
    stopped_at = load_checkpoint(tmp_path / "a" / "checkpoint.h5").epoch
    assert stopped_at < 40

    resumed = subprocess.run(TRAIN + ["--resume", str(tmp_path / "a"), "--device", "cpu"], capture_output=True,
                             text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    straight = subprocess.run(TRAIN + common + ["--run-dir", str(tmp_path / "b")], capture_output=True, text=True,
                              env=env, timeout=300)
    assert straight.returncode == 0, straight.stderr
    a, b = load_checkpoint(tmp_path / "a" / "checkpoint.h5"), load_checkpoint(tmp_path / "b" / "checkpoint.h5")
    assert a.epoch == b.epoch == 40
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])


def test_atomic_write_keeps_the_old_file_when_verification_fails(tmp_path):
    from ksae_cupy.training.checkpoint import write_hdf5_atomically

    path = tmp_path / "f.h5"
    write_hdf5_atomically(path, lambda f: f.attrs.__setitem__("v", 1), lambda p: None)

    def refuse(p):
        raise KsaeError(f"{p} is damaged")

    with pytest.raises(KsaeError, match="damaged"):
        write_hdf5_atomically(path, lambda f: f.attrs.__setitem__("v", 2), refuse)
    with h5py.File(path, "r") as f:
        assert f.attrs["v"] == 1
