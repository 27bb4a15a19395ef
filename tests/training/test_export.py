"""Export (ksae_cupy.export, ksae-data export): the documented nn.Linear layout, read back without this
package's reader, gives the model's own codes and reconstructions."""
import json
import struct
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import ksae_cupy
from ksae_cupy import KSparseAutoencoder
from ksae_cupy.cli.data import data_command
from ksae_cupy.errors import KsaeError
from ksae_cupy.session.export import read_export
from clicheck import assert_one_line_error

D, H, K = 12, 20, 3  # D != H, so that a transposed weight cannot pass for the right one


def fitted(**overrides):
    X = np.random.default_rng(0).random((200, D)).astype(np.float32)
    model = KSparseAutoencoder(**{**dict(n_hidden=H, k=K, k_start=None, epochs=3, batch_size=20, device="cpu",
                                         center_input=True, alpha=2.0), **overrides}).fit(X)
    return model, X


def parse_safetensors(path):
    """The format as its specification says, read here by hand: 8-byte little-endian header length, JSON header
    (dtype, shape, data_offsets per tensor; __metadata__ of strings), then the raw little-endian bytes."""
    blob = path.read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    metadata = header.pop("__metadata__")
    dtypes = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "U8": "u1"}
    ends = sorted(entry["data_offsets"] for entry in header.values())
    assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:]))  # no hole, no overlap
    assert 8 + size + ends[-1][1] == len(blob) and (8 + size) % 8 == 0
    tensors = {name: np.frombuffer(blob[8 + size + e["data_offsets"][0]:8 + size + e["data_offsets"][1]],
                                   dtype=dtypes[e["dtype"]]).reshape(e["shape"]) for name, e in header.items()}
    return tensors, metadata


def codes_from_layers(t, X, kept, activation="linear"):
    """What the documented few lines of PyTorch do, in NumPy: encoder, keep the ``kept`` largest, decoder."""
    Z = X.astype(np.float32) @ t["encoder.weight"].T + t["encoder.bias"]
    top = np.argsort(-Z, axis=1, kind="stable")[:, :kept]
    H_code = np.zeros_like(Z)
    np.put_along_axis(H_code, top, np.take_along_axis(Z, top, axis=1), axis=1)
    if activation == "relu":
        H_code = np.maximum(H_code, 0)
    return H_code, H_code @ t["decoder.weight"].T + t["decoder.bias"]


def check_layers(t, model, X, alpha_k):
    assert t["encoder.weight"].shape == (H, D) and t["encoder.bias"].shape == (H,)
    assert t["decoder.weight"].shape == (D, H) and t["decoder.bias"].shape == (D,)
    assert np.array_equal(t["decoder.weight"], t["encoder.weight"].T)  # tied
    features, _ = codes_from_layers(t, X, alpha_k)
    np.testing.assert_allclose(features, model.transform(X), rtol=1e-5, atol=1e-6)  # the mean folded in b
    assert np.array_equal(features != 0, model.transform(X) != 0)
    code_k, Xhat = codes_from_layers(t, X, K)
    np.testing.assert_allclose(Xhat, model.inverse_transform(model.transform(X, alpha=1)), rtol=1e-5, atol=1e-5)


def test_safetensors_round_trip_gives_the_models_codes(tmp_path):
    model, X = fitted()
    path = tmp_path / "model.safetensors"
    written = ksae_cupy.export(model, path)
    tensors, metadata = parse_safetensors(path)
    check_layers(tensors, model, X, alpha_k=6)
    assert (metadata["k"], metadata["alpha"], metadata["alpha_k"], metadata["activation"]) == ("3", "2.0", "6", "linear")
    assert json.loads(metadata["exported_by"])["version"] == ksae_cupy.__version__
    assert metadata["input_mean_folded"] == "true" and metadata["format"] == "ksae-cupy export"
    back, read_metadata = read_export(path)  # this package's reader: the same arrays and metadata
    assert read_metadata == written and all(np.array_equal(back[n], tensors[n]) for n in tensors)
    try:
        from safetensors.numpy import load_file
    except ImportError:  # the hand parser above has read it
        return
    by_them = load_file(str(path))
    assert all(np.array_equal(by_them[n], tensors[n]) for n in tensors) and set(by_them) == set(tensors)


def test_npz_round_trip_gives_the_models_codes(tmp_path):
    model, X = fitted(activation="relu")
    path = tmp_path / "model.npz"
    written = ksae_cupy.export(model, path, alpha=3)
    with np.load(path, allow_pickle=False) as f:
        tensors = {name: f[name] for name in f.files if name != "__metadata__"}
        metadata = json.loads(str(f["__metadata__"]))
    assert metadata == written and (metadata["activation"], metadata["alpha_k"]) == ("relu", 9)
    assert sorted(tensors) == ["decoder.bias", "decoder.weight", "encoder.bias", "encoder.weight", "input.mean",
                               "units.dead", "units.firing_count"]
    features, _ = codes_from_layers(tensors, X, 9, "relu")
    np.testing.assert_allclose(features, model.transform(X, alpha=3), rtol=1e-5, atol=1e-6)


def test_ksae_data_export_writes_a_run_folders_model_with_its_provenance(tmp_path):
    from ksae_cupy.cli.train import train_command

    X = np.random.default_rng(1).random((300, D)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    run = tmp_path / "run"
    args = [str(tmp_path / "x.npy"), "--hidden", str(H), "--k", str(K), "--epochs", "2", "--batch-size", "30",
            "--device", "cpu", "--run-dir", str(run), "--quiet", "--threads", "1"]
    assert CliRunner().invoke(train_command, args, catch_exceptions=False).exit_code == 0
    out = tmp_path / "run.safetensors"
    result = CliRunner().invoke(data_command, ["export", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out}: encoder {H} x {D} and decoder {D} x {H} float32, k {K}, alpha 3 "
                                    f"(the paper's 3), alpha*k 9")
    tensors, metadata = read_export(out)
    config = json.loads((run / "config.json").read_text())
    assert metadata["run_id"] == config["run_id"] and metadata["alpha"] == 3.0 and metadata["epoch"] == 2
    assert metadata["trained_by"] == config["provenance"]["created_by"]  # the checkpoint's record of its code
    model = ksae_cupy.load(run / "checkpoint.h5", device="cpu")
    check_layers(tensors, model.set_params(alpha=3.0), X, alpha_k=9)


def test_bad_exports_are_one_line_and_write_nothing(tmp_path, monkeypatch):
    model, _ = fitted()
    model.save(tmp_path / "model.h5")
    cases = [
        (["--out", str(tmp_path / "m.bin")], "cannot tell the format of"),
        (["--out", str(tmp_path / "m.npz"), "--format", "torch"], "--format torch does not match the file name"),
        (["--out", str(tmp_path / "m.npz"), "--alpha", "0.5"], "--alpha 0.5 is not allowed"),
        (["--out", str(tmp_path / "m.npz"), "--alpha", "10"], "exceeds the 20 hidden units"),
    ]
    for extra, message in cases:
        result = CliRunner().invoke(data_command, ["export", str(tmp_path / "model.h5"), *extra])
        assert_one_line_error(result, message, status=2)
    missing = CliRunner().invoke(data_command, ["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "m.npz")])
    assert_one_line_error(missing, "does not exist", status=2)
    monkeypatch.setitem(sys.modules, "torch", None)  # PyTorch absent (an import of it fails)
    no_torch = CliRunner().invoke(data_command, ["export", str(tmp_path / "model.h5"), "--out", str(tmp_path / "m.pt")])
    assert_one_line_error(no_torch, "--format torch needs PyTorch, which is not installed", status=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.h5"]  # nothing written, no temporary left
    with pytest.raises(KsaeError, match="format 'onnx' is not allowed"):
        ksae_cupy.export(model, tmp_path / "m.onnx", format="onnx")
