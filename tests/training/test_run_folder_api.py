"""From a run folder to codes in one line: ``ksae_cupy.load(RUN)`` opens the folder, the alpha default is one rule
(the run's evaluated choice, else 3) across load, transform, ksae-data codes, export and ksae-sweep, and codes come
out sparse (CSR or top-k) unless dense is asked for."""
import json

import numpy as np
import pytest
import scipy.sparse
from click.testing import CliRunner

import ksae_cupy
from ksae_cupy import KSparseAutoencoder
from ksae_cupy.cli.data import data_command
from ksae_cupy.datasets import load_dataset
from runfolder import train_centred_synthetic_run
from ksae_cupy.training.chosen_alpha import default_alpha, fallback_alpha


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_centred_synthetic_run(tmp_path_factory.mktemp("runs") / "quick")


def rows():
    return load_dataset("synthetic").X_train[:300]


def test_load_opens_the_run_folder_as_the_commands_take_it(run_dir):
    from_folder = ksae_cupy.load(run_dir)
    from_file = ksae_cupy.load(run_dir / "checkpoint.h5")
    X = rows()
    assert np.array_equal(from_folder.transform(X), from_file.transform(X))
    assert from_folder.preprocess_["input_mean"].shape == (X.shape[1],)  # the run's centring applied by transform


def test_load_without_a_checkpoint_says_so(tmp_path):
    with pytest.raises(ksae_cupy.KsaeError, match="holds no checkpoint.h5"):
        ksae_cupy.load(tmp_path)


def test_alpha_is_three_until_an_evaluation_chose_one(run_dir, tmp_path):
    model = ksae_cupy.load(run_dir)
    assert model.alpha is None and model.alpha_ == 3.0
    assert ((model.transform(rows()) != 0).sum(axis=1) == 15).all()  # alpha*k = 15 units kept
    evaluated = tmp_path / "evaluated"
    evaluated.mkdir()
    for name in ("checkpoint.h5", "config.json"):
        (evaluated / name).write_bytes((run_dir / name).read_bytes())
    epoch = model.trainer_.epoch
    (evaluated / "eval.json").write_text(json.dumps({"epoch": epoch, "features": {"selected": {"alpha": 2}}}))
    assert ksae_cupy.load(evaluated).alpha == 2.0 and default_alpha(5, 64, evaluated, epoch)[0] == 2.0
    (evaluated / "eval.json").write_text(json.dumps({"epoch": epoch + 1, "features": {"selected": {"alpha": 2}}}))
    assert ksae_cupy.load(evaluated).alpha_ == 3.0  # an evaluation of another checkpoint does not count


def test_one_rule_for_every_default():
    assert KSparseAutoencoder().alpha is None and KSparseAutoencoder(n_hidden=64, k=25).alpha_ == 64 / 25
    assert fallback_alpha(25, 1000) == 3.0
    from ksae_cupy.cli.sweep import sweep_command
    from ksae_cupy.parallel.sweep import grid

    assert [row["alphas"] for row in grid([5, 40], None, [64], [0], [1])] == [[3.0], [64 / 40]]
    defaults = [{p.name: p.default for p in command.params}
                for command in (data_command.commands["codes"], data_command.commands["export"], sweep_command)]
    assert defaults[0]["alpha"] is None and defaults[1]["alpha"] is None and defaults[2]["alphas"] is None


def test_transform_gives_csr_or_topk(run_dir):
    model, X = ksae_cupy.load(run_dir), rows()
    dense = model.transform(X, alpha=2, chunk=128)  # the same chunks: the same float sums
    csr = model.transform(X, alpha=2, sparse=True, chunk=128)  # chunks joined
    assert scipy.sparse.isspmatrix_csr(csr) and np.array_equal(csr.toarray(), dense)
    idx_nK, val_nK = model.transform(X, alpha=2, sparse="topk", chunk=128)
    assert idx_nK.shape == val_nK.shape == (300, 10)
    rebuilt = np.zeros_like(dense)
    np.put_along_axis(rebuilt, idx_nK.astype(np.int64), val_nK, axis=1)
    assert np.array_equal(rebuilt, dense)
    with pytest.raises(ksae_cupy.KsaeError, match="sparse='coo' is not allowed"):
        model.transform(X, sparse="coo")


def test_codes_are_csr_by_default_and_dense_on_request(run_dir, tmp_path):
    runner = CliRunner()
    out = tmp_path / "codes.npz"
    result = runner.invoke(data_command, ["codes", str(run_dir), str(out)])
    assert result.exit_code == 0, result.output
    assert "csr" in result.output and "alpha 3" in result.output and str(tmp_path / "codes.json") in result.output
    codes = scipy.sparse.load_npz(out)
    model = ksae_cupy.load(run_dir)
    X = load_dataset("synthetic").X_train
    assert codes.shape == (len(X), 64) and codes.nnz <= 15 * len(X)
    np.testing.assert_array_equal(codes[:200].toarray(), model.transform(X[:200], dtype=np.float64))
    assert json.loads((tmp_path / "codes.json").read_text())  # the side file the help names
    assert "codes.npz: codes.json" in " ".join(runner.invoke(data_command, ["codes", "--help"]).output.split())
    dense = tmp_path / "dense.npy"  # an .npy asks for dense codes (its side file dense.json: codes.json stays)
    assert runner.invoke(data_command, ["codes", str(run_dir), str(dense)]).exit_code == 0
    np.testing.assert_array_equal(np.load(dense), codes.toarray())
    wrong = runner.invoke(data_command, ["codes", str(run_dir), str(tmp_path / "c.npy"), "--layout", "csr"])
    assert wrong.exit_code != 0 and "with --layout csr" in wrong.output
    assert runner.invoke(data_command, ["codes", str(run_dir), str(tmp_path / "c.txt")]).exit_code != 0
    topk = tmp_path / "top.npz"
    assert runner.invoke(data_command, ["codes", str(run_dir), str(topk), "--layout", "topk"]).exit_code == 0
    with np.load(topk) as f:
        assert f["indices"].shape == f["values"].shape == (len(X), 15) and int(f["n_hidden"]) == 64


def test_the_next_layer_trains_on_the_csr_codes(run_dir, tmp_path):
    from ksae_cupy.datasets.user_files import DataSpec

    out = tmp_path / "codes.npz"
    assert CliRunner().invoke(data_command, ["codes", str(run_dir), str(out)]).exit_code == 0
    X = load_dataset(DataSpec.from_record(str(out), None)).X_train
    assert X.dtype == np.float32 and X.shape[1] == 64


def test_raw_inputs_applies_the_datasets_scale(run_dir, tmp_path):
    mnist_like = tmp_path / "mnist-like"
    mnist_like.mkdir()
    (mnist_like / "checkpoint.h5").write_bytes((run_dir / "checkpoint.h5").read_bytes())
    config = json.loads((run_dir / "config.json").read_text())
    (mnist_like / "config.json").write_text(json.dumps({**config, "dataset": "mnist"}))
    model = ksae_cupy.load(mnist_like, raw_inputs=True)
    assert model.input_scale == 1 / 255
    X = rows()
    np.testing.assert_allclose(model.transform(X * np.float32(255)), ksae_cupy.load(mnist_like).transform(X),
                               rtol=1e-4, atol=1e-5)
    (mnist_like / "config.json").write_text(json.dumps({**config, "dataset": "norb"}))  # standardised: no one scale
    with pytest.raises(ksae_cupy.KsaeError, match="raw_inputs=True needs a run folder of a built-in dataset"):
        ksae_cupy.load(mnist_like, raw_inputs=True)


@pytest.mark.gpu
def test_sparse_codes_and_unit_counts_on_the_gpu(gpu_cupy):
    cupy = gpu_cupy  # CuPy on a GPU, else the stand-in (tests/cupy_standin)
    X = rows()
    model = KSparseAutoencoder(n_hidden=32, k=3, k_start=None, epochs=2, batch_size=50, device="gpu").fit(X)
    on_cpu = pickle_round_trip(model)
    from ksae_cupy.metrics import firing_counts

    host = {name: np.asarray(value) for name, value in on_cpu.params_.items()}
    assert model.unit_counts_["firing_counts"] == firing_counts(host, X, 3).tolist()  # measured on the device
    csr = model.transform(cupy.asarray(X), sparse=True)  # CuPy in: codes come back on the host as CSR
    assert scipy.sparse.isspmatrix_csr(csr)
    np.testing.assert_allclose(csr.toarray(), on_cpu.transform(X), rtol=1e-5, atol=1e-6)


def pickle_round_trip(model):
    import pickle

    return pickle.loads(pickle.dumps(model))
