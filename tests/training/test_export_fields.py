"""The export carries what its reader must not guess (input scale and mean, the chosen alpha and where it came
from, the dead units and every unit's firing count), has a default name, and has the layouts SAELens and
sparsify load (W_enc, b_enc, W_dec, b_dec and cfg.json). Read back with NumPy alone, the codes come out as ours,
up to ties within float rounding."""
import json
import struct

import numpy as np
import pytest
from click.testing import CliRunner

import ksae_cupy
from ksae_cupy.cli.data import data_command
from ksae_cupy.datasets import load_dataset
from runfolder import train_centred_synthetic_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_centred_synthetic_run(tmp_path_factory.mktemp("runs") / "quick")


def numpy_safetensors(path):
    """A safetensors file read with NumPy and the format's specification only (no package of ours or theirs)."""
    blob = path.read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    metadata = header.pop("__metadata__")
    dtypes = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "U8": "u1"}
    return {name: np.frombuffer(blob[8 + size + e["data_offsets"][0]:8 + size + e["data_offsets"][1]],
                                dtype=dtypes[e["dtype"]]).reshape(e["shape"]) for name, e in header.items()}, metadata


def assert_same_codes_up_to_ties(Z_nh, ours_nh, kept):
    """The reader's codes (the ``kept`` largest of its pre-activations ``Z_nh``) against ours: the same values
    wherever both keep a unit, and any unit kept by one only ties the row's kept-th value within float32 rounding."""
    order = np.argsort(-Z_nh, axis=1, kind="stable")
    theirs = np.zeros_like(Z_nh, dtype=bool)
    np.put_along_axis(theirs, order[:, :kept], True, axis=1)
    boundary_n = np.take_along_axis(Z_nh, order[:, kept - 1:kept], axis=1)
    differ = theirs != (ours_nh != 0)
    tolerance = 1e-5 * (1 + np.abs(boundary_n))
    assert (np.abs(Z_nh - boundary_n)[differ] <= np.broadcast_to(tolerance, Z_nh.shape)[differ]).all()
    both = theirs & (ours_nh != 0)
    np.testing.assert_allclose(Z_nh[both], ours_nh[both], rtol=1e-5, atol=1e-5)
    return int(differ.any(axis=1).sum())


def test_the_export_carries_scale_mean_alpha_and_units_and_rebuilds_our_codes(run_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(data_command, ["export", str(run_dir)])
    assert result.exit_code == 0, result.output
    path = tmp_path / "quick.safetensors"  # the default name: the run's
    assert f"wrote {path.name}" in result.output and "alpha 3 (the paper's 3)" in result.output
    tensors, metadata = numpy_safetensors(path)
    model = ksae_cupy.load(run_dir)
    units = json.loads((run_dir / "units.json").read_text())
    np.testing.assert_array_equal(tensors["input.mean"], model.preprocess_["input_mean"])
    np.testing.assert_array_equal(tensors["units.firing_count"], units["firing_counts"])
    np.testing.assert_array_equal(tensors["units.dead"], np.asarray(units["firing_counts"]) == 0)
    assert json.loads(metadata["n_dead"]) == units["n_dead"] == int(tensors["units.dead"].sum())
    assert (json.loads(metadata["alpha"]), metadata["alpha_from"]) == (3.0, "the paper's 3")
    assert json.loads(metadata["input_scale"]) == 1.0 and metadata["input_mean_folded"] == "true"
    assert "training row" in metadata["dead_definition"]
    X = load_dataset("synthetic").X_test
    Z = X.astype(np.float64) @ tensors["encoder.weight"].T.astype(np.float64) + tensors["encoder.bias"]
    assert_same_codes_up_to_ties(Z, model.transform(X), kept=15)


def test_npz_carries_the_same_fields(run_dir, tmp_path):
    out = tmp_path / "m.npz"
    assert CliRunner().invoke(data_command, ["export", str(run_dir), "--out", str(out)]).exit_code == 0
    with np.load(out) as f:
        assert {"input.mean", "units.firing_count", "units.dead"} <= set(f.files)
        assert json.loads(str(f["__metadata__"]))["alpha_from"] == "the paper's 3"


def test_saelens_layout_loads_by_its_names_and_config(run_dir, tmp_path):
    out = tmp_path / "sae"
    result = CliRunner().invoke(data_command, ["export", str(run_dir), "--layout", "saelens", "--out", str(out)])
    assert result.exit_code == 0, result.output
    tensors, _ = numpy_safetensors(out / "sae_weights.safetensors")
    assert set(tensors) == {"W_enc", "b_enc", "W_dec", "b_dec"}  # SAELens loads the file strictly
    assert set(numpy_safetensors(out / "ksae_cupy.safetensors")[0]) == {"input.mean", "units.firing_count",
                                                                      "units.dead"}
    cfg = json.loads((out / "cfg.json").read_text())
    assert (cfg["d_in"], cfg["d_sae"], cfg["architecture"], cfg["activation_fn_kwargs"]) == (64, 64, "topk", {"k": 5})
    assert cfg["apply_b_dec_to_input"] is False and cfg["ksae_cupy"]["alpha"] == 3.0
    assert tensors["W_enc"].shape == (64, 64) and tensors["W_dec"].shape == (64, 64)
    X = load_dataset("synthetic").X_test
    model = ksae_cupy.load(run_dir)
    Z = X.astype(np.float64) @ tensors["W_enc"].astype(np.float64) + tensors["b_enc"]  # SAELens' encoder
    assert_same_codes_up_to_ties(Z, model.transform(X, alpha=1), kept=5)
    H_code = np.where(model.transform(X, alpha=1) != 0, Z, 0)
    np.testing.assert_allclose(H_code @ tensors["W_dec"] + tensors["b_dec"],
                               model.inverse_transform(model.transform(X, alpha=1)), rtol=1e-4, atol=1e-4)


def test_sparsify_layout_subtracts_b_dec_first(run_dir, tmp_path):
    out = tmp_path / "sp"
    assert CliRunner().invoke(data_command, ["export", str(run_dir), "--layout", "sparsify",
                                             "--out", str(out)]).exit_code == 0
    tensors, _ = numpy_safetensors(out / "sae.safetensors")
    assert set(tensors) == {"encoder.weight", "encoder.bias", "W_dec", "b_dec"}  # sparsify loads it strictly
    cfg = json.loads((out / "cfg.json").read_text())
    assert (cfg["d_in"], cfg["num_latents"], cfg["k"], cfg["activation"]) == (64, 64, 5, "topk")
    assert "expansion_factor" not in cfg  # an int in sparsify's config; num_latents says H
    X = load_dataset("synthetic").X_test.astype(np.float64)
    Z = (X - tensors["b_dec"]) @ tensors["encoder.weight"].T.astype(np.float64) + tensors["encoder.bias"]
    assert_same_codes_up_to_ties(Z, ksae_cupy.load(run_dir).transform(X.astype(np.float32), alpha=1), kept=5)


def test_a_layout_folder_is_never_written_over(run_dir, tmp_path):
    out = tmp_path / "sae"
    out.mkdir()
    result = CliRunner().invoke(data_command, ["export", str(run_dir), "--layout", "saelens", "--out", str(out)])
    assert result.exit_code != 0 and "already exists" in result.output
