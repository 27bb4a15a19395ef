"""The SAELens and sparsify folders of ``ksae-data export --layout``, loaded by those libraries' own loaders
(``SAE.load_from_disk``, ``SparseCoder.load_from_disk``): their config says our shape, k and activation, their
encoder gives our codes and their decoder our reconstructions, within float32 rounding.

The libraries are the ``fieldlibs`` extra (``pip install 'ksae-cupy[fieldlibs]'``, PyTorch's CPU build with
them); CI installs it and sets KSAE_FIELDLIBS_REQUIRED=1, so there a missing library fails these tests instead of
skipping them. Both libraries keep only the positive values of the top k (a ReLU): a linear model's negative kept
values read as 0 there."""
import importlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import ksae_cupy
from ksae_cupy.cli.data import data_command
from ksae_cupy.datasets import load_dataset
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.session.export import read_export
from runfolder import train_centred_synthetic_run

REPOSITORY = Path(__file__).resolve().parents[2]
REQUIRED = "KSAE_FIELDLIBS_REQUIRED"  # 1: a missing library fails these tests (CI), else they skip


def field_library(module: str):
    """``module`` imported; where it is missing, a skip naming the extra, except in CI (which installs it): a
    failure there, so that the libraries' check never goes quietly missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = f"{module} does not import ({exc}); it is the fieldlibs extra: pip install 'ksae-cupy[fieldlibs]'"
        shadow = getattr(sys.modules.get("kernels"), "__file__", None) or ""
        if Path(shadow).parent == REPOSITORY / "kernels":  # `python -m pytest` put the repository on sys.path
            why = (f"{module} does not import: the repository's kernels/ stands in for the package kernels that "
                   f"transformers imports; run pytest (as CI does), not python -m pytest, from the repository")
        if os.environ.get(REQUIRED, "") == "1":  # .ci/run sets it: there the extra is installed
            pytest.fail(f"{why}, which .ci/run installs")
        pytest.skip(why)


@pytest.fixture(scope="module")
def torch():
    return field_library("torch")


@pytest.fixture(scope="module")
def SAE():
    return field_library("sae_lens").SAE


@pytest.fixture(scope="module")
def SparseCoder():
    return field_library("sparsify").SparseCoder


@pytest.fixture(scope="module")
def linear_run(tmp_path_factory):
    """A ksae-train run folder: linear units, --center-input (its mean folded into both biases), 64 units, k 5."""
    return train_centred_synthetic_run(tmp_path_factory.mktemp("runs") / "quick")


@pytest.fixture(scope="module")
def relu_model():
    """A fitted estimator of ReLU units (as both libraries' are), centred inputs, 48 units over 32 inputs, k 4."""
    X_nd = make_sparse_signals(600, D=32, H=48, k=4, n_classes=4, seed=0)[0].astype(np.float32)
    model = ksae_cupy.KSparseAutoencoder(n_hidden=48, k=4, epochs=2, device="cpu", activation="relu",
                                         center_input=True, n_threads=1)
    return model.fit(X_nd), X_nd[:200]


def case(fixture):
    """``(source, model, X_nd)``: what is exported (a run folder or an estimator), the model as ours, its rows."""
    if isinstance(fixture, tuple):
        return fixture[0], fixture[0], fixture[1]
    return fixture, ksae_cupy.load(fixture), load_dataset("synthetic").X_test.astype(np.float32)


def export_folder(source, folder, layout):
    """``source`` (a run folder through the CLI, or an estimator through the Python API) exported to ``folder``."""
    if isinstance(source, ksae_cupy.KSparseAutoencoder):
        ksae_cupy.export(source, folder, layout=layout)
    else:
        result = CliRunner().invoke(data_command, ["export", str(source), "--layout", layout, "--out", str(folder)])
        assert result.exit_code == 0, result.output
    return folder


def assert_same_codes_up_to_ties(theirs_nh, ours_nh, k):
    """Dense codes of k kept units: equal wherever both keep a unit; a unit kept (non-zero) by one side only
    ties the row's k-th largest value within float32 rounding (sums in another order may swap such a pair)."""
    boundary_n = -np.sort(-np.maximum(theirs_nh, ours_nh), axis=1)[:, k - 1:k]
    differ = (theirs_nh != 0) != (ours_nh != 0)
    tolerance = np.broadcast_to(1e-5 * (1 + np.abs(boundary_n)), ours_nh.shape)
    assert (np.abs(np.maximum(theirs_nh, ours_nh) - boundary_n)[differ] <= tolerance[differ]).all()
    both = (theirs_nh != 0) & (ours_nh != 0)
    np.testing.assert_allclose(theirs_nh[both], ours_nh[both], rtol=1e-5, atol=1e-5)
    assert differ.any(axis=1).mean() <= 0.01  # a tie now and then, not another selection
    return ~differ.any(axis=1)


def top_k_pairs(code_nh, k):
    """``(idx_nk, val_nk)`` of dense codes: each row's non-zero columns first (sparsify's decoder takes pairs)."""
    idx_nk = np.argsort(code_nh == 0, axis=1, kind="stable")[:, :k]
    return idx_nk, np.take_along_axis(code_nh, idx_nk, axis=1)


@pytest.mark.parametrize("which", ["linear_run", "relu_model"])
def test_saelens_loads_the_folder_and_encodes_and_decodes_as_we_do(which, request, tmp_path, torch, SAE):
    source, model, X_nd = case(request.getfixturevalue(which))
    k, (D, H) = model.k, model.params_["W_dh"].shape
    sae = SAE.load_from_disk(export_folder(source, tmp_path / "sae", "saelens"))

    assert type(sae).__name__ == "TopKSAE" and sae.cfg.architecture() == "topk"
    assert (sae.cfg.d_in, sae.cfg.d_sae, sae.cfg.k, sae.cfg.dtype) == (D, H, k, "float32")
    assert sae.cfg.apply_b_dec_to_input is False and sae.cfg.normalize_activations == "none"
    assert sae.cfg.rescale_acts_by_decoder_norm is False
    ours_nh = model.transform(X_nd, alpha=1)
    with torch.no_grad():
        theirs_nh = sae.encode(torch.from_numpy(X_nd)).numpy()
        decoded_nd = sae.decode(torch.from_numpy(ours_nh)).numpy()
        rebuilt_nd = sae(torch.from_numpy(X_nd)).numpy()
    same_n = assert_same_codes_up_to_ties(theirs_nh, np.maximum(ours_nh, 0), k)  # their ReLU on our top k
    np.testing.assert_allclose(decoded_nd, model.inverse_transform(ours_nh), rtol=1e-5, atol=1e-5)
    if which == "relu_model":  # their whole forward pass is ours, row for row (where no tie swapped a unit)
        np.testing.assert_allclose(rebuilt_nd[same_n], model.inverse_transform(ours_nh)[same_n],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", ["linear_run", "relu_model"])
def test_sparsify_loads_the_folder_and_encodes_and_decodes_as_we_do(which, request, tmp_path, torch, SparseCoder):
    source, model, X_nd = case(request.getfixturevalue(which))
    k, (D, H) = model.k, model.params_["W_dh"].shape
    coder = SparseCoder.load_from_disk(export_folder(source, tmp_path / "sp", "sparsify"))

    assert (coder.d_in, coder.num_latents, coder.cfg.k, coder.cfg.activation) == (D, H, k, "topk")
    assert not (coder.cfg.normalize_decoder or coder.cfg.multi_topk or coder.cfg.transcode)
    assert coder.cfg.skip_connection is False and coder.W_skip is None and coder.dtype == torch.float32
    ours_nh = model.transform(X_nd, alpha=1)
    with torch.no_grad():
        top = coder.encode(torch.from_numpy(X_nd))
        idx_nk, val_nk = top_k_pairs(ours_nh, k)
        decoded_nd = coder.decode(torch.from_numpy(val_nk), torch.from_numpy(idx_nk)).numpy()
        theirs_nh = np.zeros_like(ours_nh)
        np.put_along_axis(theirs_nh, top.top_indices.numpy(), top.top_acts.numpy(), axis=1)
        rebuilt_nd = coder.decode(top.top_acts, top.top_indices).numpy()
    same_n = assert_same_codes_up_to_ties(theirs_nh, np.maximum(ours_nh, 0), k)  # their ReLU on our top k
    np.testing.assert_allclose(decoded_nd, model.inverse_transform(ours_nh), rtol=1e-5, atol=1e-5)
    if which == "relu_model":
        np.testing.assert_allclose(rebuilt_nd[same_n], model.inverse_transform(ours_nh)[same_n],
                                   rtol=1e-5, atol=1e-5)


def test_the_folders_own_tensors_lie_beside_the_librarys(SAE, linear_run, tmp_path):
    """What the libraries do not load (the input mean, the unit counts) is in ksae_cupy.safetensors, read back
    as the linear export holds it; cfg.json's ksae_cupy holds the metadata, which SAELens' loader leaves aside."""
    folder = export_folder(linear_run, tmp_path / "sae", "saelens")
    SAE.load_from_disk(folder)
    tensors, metadata = read_export(folder / "ksae_cupy.safetensors")
    ksae_cupy.export(linear_run, tmp_path / "m.safetensors")
    linear, _ = read_export(tmp_path / "m.safetensors")
    assert set(tensors) == {"input.mean", "units.firing_count", "units.dead"}
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, linear[name])
    cfg = json.loads((folder / "cfg.json").read_text())
    assert metadata["k"] == cfg["ksae_cupy"]["k"] == 5 and metadata["input_mean_folded"] is True
