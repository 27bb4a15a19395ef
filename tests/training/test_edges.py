"""The metrics and the estimator at their edges: NaN in is NaN out, no rows is an error, and the estimator
refuses what the command line refuses, in the same words."""
import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy import KSparseAutoencoder
from ksae_cupy.cli.train import train_command
from ksae_cupy.errors import KsaeError
from ksae_cupy.metrics import fraction_of_variance_explained


def test_fve_of_nan_is_nan_not_a_confident_score():
    X = np.random.default_rng(0).random((6, 4))
    bad = X.copy()
    bad[2, 1] = np.nan
    assert np.isnan(fraction_of_variance_explained(X, bad))
    assert np.isnan(fraction_of_variance_explained(bad, X))
    constant = np.ones((5, 3))
    assert np.isnan(fraction_of_variance_explained(constant, np.full((5, 3), np.nan)))


def test_fve_of_no_rows_is_an_error():
    with pytest.raises(ValueError, match="no rows"):
        fraction_of_variance_explained(np.zeros((0, 4)), np.zeros((0, 4)))


def test_fve_of_different_shapes_is_an_error():
    with pytest.raises(ValueError, match="differ in shape"):
        fraction_of_variance_explained(np.zeros((3, 4)), np.zeros((3, 5)))


def test_fit_refuses_one_row_as_the_command_line_does(tmp_path):
    X = np.random.default_rng(0).random((1, 16), dtype=np.float32)
    with pytest.raises(KsaeError) as caught:
        KSparseAutoencoder(n_hidden=8, k=2).fit(X)
    assert str(caught.value) == "X: array of shape (1, 16) (n_samples=1); expected N x D with N >= 2"
    np.save(tmp_path / "one.npy", X)
    result = CliRunner().invoke(train_command, [str(tmp_path / "one.npy"), "--hidden", "8", "--k", "2"])
    assert_one_line_error(result, "array of shape (1, 16) (n_samples=1); expected N x D with N >= 2", status=2)


def test_constant_rows_centred_are_not_called_zeros(tmp_path):
    np.save(tmp_path / "half.npy", np.full((50, 16), 0.5, np.float32))
    result = CliRunner().invoke(train_command, [str(tmp_path / "half.npy"), "--center-input", "--hidden", "8",
                                                "--k", "2", "--batch-size", "10", "--run-dir", str(tmp_path / "r")])
    assert_one_line_error(result, "all the same", "before --center-input subtracted their mean", status=2)
    assert "(every value 0)" not in result.stderr
