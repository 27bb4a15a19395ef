"""FVE, L0 and dead units (ksae_cupy/metrics.py): against their definitions and scikit-learn's R^2."""
import numpy as np
import pytest
from sklearn.metrics import r2_score

from ksae_cupy import metrics, model


def setup(N=53, D=12, H=20, seed=0):
    rng = np.random.default_rng(seed)
    params = model.init_params(D, H, 0.3, rng)
    params["b_h"] = (0.1 * rng.standard_normal(H)).astype(np.float32)
    params["c_d"] = (0.1 * rng.standard_normal(D)).astype(np.float32)
    return params, rng.random((N, D)).astype(np.float32)


def test_fve_is_scikit_learns_variance_weighted_r2():
    params, X = setup()
    Xhat, _ = model.forward(params, X, 5)
    assert metrics.fraction_of_variance_explained(X, Xhat) == pytest.approx(
        r2_score(X.astype(np.float64), Xhat.astype(np.float64), multioutput="variance_weighted"), rel=1e-9)
    assert metrics.fraction_of_variance_explained(X, X) == 1.0
    mean = np.broadcast_to(X.astype(np.float64).mean(axis=0), X.shape)
    assert metrics.fraction_of_variance_explained(X, mean) == pytest.approx(0.0, abs=1e-12)
    assert metrics.fraction_of_variance_explained(X, 2 * mean) < 0  # worse than the mean
    constant = np.ones((4, 3))
    assert metrics.fraction_of_variance_explained(constant, constant) == 1.0
    assert metrics.fraction_of_variance_explained(constant, constant + 1) == 0.0


def test_total_variance_in_chunks_keeps_its_digits_far_from_zero():
    X = np.random.default_rng(1).random((1001, 7)) + 1e6  # sum x^2 - N mean^2 would lose most digits
    exact = ((X - X.mean(axis=0)) ** 2).sum()
    assert metrics.total_variance(X, chunk=64) == pytest.approx(exact, rel=1e-9)
    assert metrics.total_variance(X, chunk=5000) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("activation", ["linear", "relu"])
def test_reconstruction_metrics_follow_their_definitions_chunk_by_chunk(activation):
    params, X = setup()
    params["b_h"] -= 1.0  # some kept units negative: ReLU zeroes them
    params["b_h"][3] = -1e3  # a unit that no example keeps: dead
    k, alpha = 4, 2.5
    Xhat, cache = model.forward(params, X, k, activation=activation)
    features = model.encode(params, X, k, alpha, activation=activation)
    got = metrics.reconstruction_metrics(params, X, k, alpha, activation=activation, chunk=7)
    assert got["rows"] == len(X) and got["alpha"] == alpha
    assert got["fve"] == pytest.approx(metrics.fraction_of_variance_explained(X, Xhat), rel=1e-5)
    assert got["l0"] == metrics.mean_l0(cache.Zs_nh) and got["l0_alpha_k"] == metrics.mean_l0(features)
    assert got["dead_fraction"] == metrics.dead_fraction(cache.Zs_nh) >= 1 / 20
    if activation == "linear":
        assert (got["l0"], got["l0_alpha_k"]) == (4, 10)  # round(2.5 * 4) units, none exactly zero
    else:  # ReLU zeroes the negative survivors: fewer non-zero units than kept
        assert got["l0"] < 4 and got["l0_alpha_k"] < 10


@pytest.mark.parametrize("activation", ["linear", "relu"])
def test_reconstruction_metrics_from_units_already_found_are_the_same(activation):
    # ksae-eval hands over its one encoding (the largest alpha's units, descending) instead of encoding again.
    from ksae_cupy.evaluation.features import top_units

    params, X = setup()
    params["b_h"] -= 1.0
    k, alpha = 4, 2.5
    top = top_units(params, X, 14, activation=activation)  # more columns than alpha*k = 10: the first are read
    again = metrics.reconstruction_metrics(params, X, k, alpha, activation=activation, chunk=7)
    given = metrics.reconstruction_metrics(params, X, k, alpha, activation=activation, chunk=7, top=top)
    assert given == pytest.approx(again, rel=1e-6)
    wrong = metrics.reconstruction_metrics(params, X, k, alpha, activation=activation, chunk=7,
                                           top=(top[0][::-1].copy(), top[1][::-1].copy()))  # other rows' units
    assert wrong["fve"] < again["fve"]


def test_l0_and_dead_fraction_of_dense_and_sparse_codes():
    import scipy.sparse as sp

    code = np.array([[0, 1.5, 0, 0], [2, 0, 0, 0], [0, -1, 0, 0]])
    assert metrics.mean_l0(code) == metrics.mean_l0(sp.csr_matrix(code)) == pytest.approx(1.0)
    assert metrics.dead_fraction(code) == metrics.dead_fraction(sp.csr_matrix(code)) == 0.5  # columns 2 and 3
