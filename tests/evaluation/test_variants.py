"""ksae-analyze variants: every evaluation variant on one run, each chosen on validation."""
import json

import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner

from ksae_cupy.cli.analyze import analyze_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.errors import KsaeError
from ksae_cupy.evaluation.variants import column_scale, make_encoder, parse_variants
from clicheck import assert_one_line_error
from runfolder import make_run, sparse_signal_dataset
from ksae_cupy.backend import CPU


def test_column_scale_gives_unit_std_on_dense_and_sparse_alike():
    rng = np.random.default_rng(0)
    F = rng.standard_normal((200, 6)) * np.array([1, 2, 3, 4, 5, 6]) * (rng.random((200, 6)) < 0.3)
    F[:, 5] = 0.0  # a dead unit keeps scale 1
    dense, csr = column_scale(F), column_scale(sp.csr_matrix(F))
    np.testing.assert_allclose(dense, csr, rtol=1e-5)
    assert dense[5] == 1.0
    np.testing.assert_allclose((F[:, :5] * dense[:5]).std(axis=0), 1.0, rtol=1e-5)


def test_encoders_of_the_variants():
    data, W_dh = sparse_signal_dataset(n_train=300, n_valid=50, n_test=50)
    params = {"W_dh": W_dh.astype(np.float32), "b_h": np.full(W_dh.shape[1], -0.05, np.float32),
              "c_d": np.zeros(W_dh.shape[0], np.float32)}
    X = data.X_valid
    plain = make_encoder("sparse", params, 5, "sort", CPU, data.X_train)(20, X)  # 100 of 128 kept: some < 0
    relu = make_encoder("relu", params, 5, "sort", CPU, data.X_train)(20, X)
    assert plain.getnnz(axis=1).max() == 100 and (plain.toarray() < 0).any()
    np.testing.assert_array_equal(relu.toarray(), np.maximum(plain.toarray(), 0))
    standardized = make_encoder("standardized", params, 5, "sort", CPU, data.X_train)
    train_std = standardized(20, data.X_train).toarray().std(axis=0)
    used = train_std > 0
    np.testing.assert_allclose(train_std[used], 1.0, rtol=1e-4)
    # The same pattern of non-zeros: scaling keeps the code sparse.
    np.testing.assert_array_equal(standardized(20, X).toarray() != 0, plain.toarray() != 0)


@pytest.mark.parametrize("text,fragment", [("bogus", "variant 'bogus'"), ("early-stop-0", "early-stop-N"),
                                           ("early-stop-x", "early-stop-N"), (",", "empty")])
def test_bad_variant_names(text, fragment):
    with pytest.raises(KsaeError, match=fragment):
        parse_variants(text)


def test_variants_command_reports_every_variant(tmp_path):
    W_dh = make_sparse_signals(1)[2]
    run_dir = make_run(tmp_path / "run", W_dh, k=5, dataset="synthetic")
    result = CliRunner().invoke(analyze_command, ["variants", str(run_dir), "--variants",
                                                  "sparse,relu,standardized,early-stop-20", "--alphas", "1,2",
                                                  "--l2", "1e-3,1e-4", "--device", "cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    report = json.loads((run_dir / "variants.json").read_text())
    assert [r["variant"] for r in report["variants"]] == ["sparse", "relu", "standardized", "early-stop-20"]
    for row in report["variants"]:
        assert 0 <= row["valid_error"] <= 1 and 0 <= row["test_error"] <= 1
        assert row["alpha"] in (1, 2)
    early = report["variants"][-1]
    assert early["l2"] == 1e-6 and all(t["n_iter"] <= 20 for t in early["trials"])
    assert "| early-stop-20 |" in (run_dir / "variants.md").read_text()


def test_variants_command_rejects_alpha_k_above_hidden(tmp_path):
    run_dir = make_run(tmp_path / "run", make_sparse_signals(1)[2], k=5, dataset="synthetic")
    result = CliRunner().invoke(analyze_command, ["variants", str(run_dir), "--alphas", "1000", "--device", "cpu"])
    assert_one_line_error(result, "alpha", "1000", status=2)
