"""Checkpoints prove their integrity: a flipped bit in any array, an edited attribute, a removed
array is one error line naming it; old checkpoints without checksums load with a one-line note."""
import random

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from resumecheck import stop_at
from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.errors import KsaeError, KsaeNote
from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint, save_finetune_checkpoint
from ksae_cupy.training import checksums
from ksae_cupy.training.checkpoint import load_checkpoint
from ksae_cupy.training.estimator import KSparseAutoencoder

X_nd = make_sparse_signals(300, D=12, H=24, k=3, seed=4)[0]


@pytest.fixture
def checkpoint_path(tmp_path):
    """A checkpoint saved mid-epoch, so that it holds every group: params, optim, rng (with the
    epoch's order), preprocess."""
    model = KSparseAutoencoder(n_hidden=20, k=3, k_start=6, epochs=3, batch_size=40, device="cpu", seed=1)
    model.preprocess_ = {"mean_d": np.linspace(0, 1, 12, dtype=np.float32)}
    model.fit(X_nd, on_batch=stop_at(model, epoch=1, batch=3))
    path = tmp_path / "c.h5"
    model.save(path)
    return path


def arrays_of(path):
    with h5py.File(path, "r") as f:
        names = []
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def flip_one_bit(path, array_name, rng):
    """Flip a random bit of the array's bytes in the file itself, as a bad disk or copy would."""
    with h5py.File(path, "r") as f:
        dset = f[array_name]
        offset, nbytes = dset.id.get_offset(), dset.id.get_storage_size()
    assert offset is not None and nbytes > 0  # contiguous storage: the bytes lie at [offset, offset + nbytes)
    position, bit = offset + rng.randrange(nbytes), rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ (1 << bit)]))


def test_every_array_and_group_carries_a_checksum_readable_by_plain_h5py(checkpoint_path):
    names = arrays_of(checkpoint_path)
    assert {"params/W_dh", "params/b_h", "params/c_d", "optim/W_dh", "optim/b_h", "optim/c_d", "rng/epoch_perm",
            "preprocess/mean_d"} <= set(names)
    with h5py.File(checkpoint_path, "r") as f:
        assert f.attrs["format_version"] == 2
        for name in ["/", "params", "optim", "rng", "preprocess", *names]:
            assert len(f[name].attrs["sha256"]) == 64, name
        np.testing.assert_array_equal(f["preprocess/mean_d"][()], np.linspace(0, 1, 12, dtype=np.float32))


def test_a_flipped_bit_in_any_array_is_caught_and_named(checkpoint_path, tmp_path):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    intact = checkpoint_path.read_bytes()
    names = arrays_of(checkpoint_path)
    for name in names:
        checkpoint_path.write_bytes(intact)
        flip_one_bit(checkpoint_path, name, rng)
        with pytest.raises(KsaeError) as info:
            load_checkpoint(checkpoint_path)
        message = str(info.value)
        assert f"array {name} does not match its SHA-256 checksum" in message, (seed, message)
        assert "\n" not in message and str(checkpoint_path) in message
    checkpoint_path.write_bytes(intact)
    assert load_checkpoint(checkpoint_path).epoch == 1


@pytest.mark.parametrize("change,named", [
    (lambda f: f.attrs.__setitem__("step", 999), "the file's attributes"),
    (lambda f: f.attrs.__setitem__("config", f.attrs["config"].replace('"k": 3', '"k": 4')), "the file's attributes"),
    (lambda f: f["rng"].attrs.__setitem__("state", f["rng"].attrs["state"].replace("1", "2", 1)), "group rng/"),
    (lambda f: f["preprocess"].__delitem__("mean_d"), "group preprocess/"),
    (lambda f: f["params"].create_dataset("extra", data=np.zeros(3)), "array params/extra has no checksum"),
])
def test_an_edited_attribute_or_a_removed_array_is_caught(checkpoint_path, change, named):
    with h5py.File(checkpoint_path, "r+") as f:
        change(f)
    with pytest.raises(KsaeError, match="checksum") as info:
        load_checkpoint(checkpoint_path)
    assert named in str(info.value)


def test_an_old_checkpoint_without_checksums_loads_with_a_note(checkpoint_path):
    with h5py.File(checkpoint_path, "r+") as f:  # as format_version 1 wrote it
        f.attrs["format_version"] = 1
        f.visititems(lambda name, obj: obj.attrs.__delitem__("sha256"))
        del f.attrs["sha256"]
    with pytest.warns(KsaeNote, match="written before checksums existed"):
        assert load_checkpoint(checkpoint_path).epoch == 1


def test_the_commands_refuse_a_damaged_checkpoint_in_one_line_and_note_an_old_one(tmp_path):
    data, run_dir = tmp_path / "x.npy", tmp_path / "run"
    np.save(data, X_nd)
    quick = ["--hidden", "16", "--k", "2", "--k-start", "4", "--batch-size", "30", "--device", "cpu"]
    assert CliRunner().invoke(train_command, [str(data), *quick, "--epochs", "2", "--run-dir", str(run_dir)]).exit_code == 0
    path = run_dir / "checkpoint.h5"
    intact = path.read_bytes()
    flip_one_bit(path, "params/W_dh", random.Random(0))
    for command, args in ((train_command, ["--resume", str(run_dir), "--epochs", "3"]), (eval_command, [str(run_dir)])):
        result = CliRunner().invoke(command, args)
        assert_one_line_error(result, "array params/W_dh does not match its SHA-256 checksum", status=2)
    path.write_bytes(intact)
    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = 1
    result = CliRunner().invoke(train_command, ["--resume", str(run_dir), "--epochs", "3"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "format_version 1" in notes[0] and "without an integrity check" in notes[0]
    assert load_checkpoint(path).epoch == 3  # and the checkpoint it wrote carries checksums again


def test_fine_tuning_checkpoints_are_checked_the_same_way(tmp_path):
    path = tmp_path / "f.h5"
    params = {"W1_dh": np.ones((4, 3), np.float32), "W_hc": np.arange(6, dtype=np.float32).reshape(3, 2)}
    state = {"phase_index": 0, "epoch": 1, "step": 5, "batch_in_epoch": 0, "config": {"lr": 0.1},
             "params": params, "velocities": {n: np.zeros_like(v) for n, v in params.items()},
             "rng_state": np.random.default_rng(0).bit_generator.state, "epoch_perm": None}
    save_finetune_checkpoint(path, state)
    flip_one_bit(path, "params/W_hc", random.Random(1))
    with pytest.raises(KsaeError, match="array params/W_hc does not match its SHA-256 checksum"):
        load_finetune_checkpoint(path)


def test_the_checksum_does_not_depend_on_how_h5py_returns_a_value(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.attrs["n"] = 3
        f.attrs["s"] = "text"
        f.create_dataset("x", data=np.arange(5, dtype=np.float64))
        checksums.seal(f)
    with h5py.File(tmp_path / "a.h5", "r") as f:
        checksums.verify(f, tmp_path / "a.h5")  # no error: bytes, strings and NumPy scalars read back alike
