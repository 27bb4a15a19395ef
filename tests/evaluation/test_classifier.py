"""Softmax regression: hand-written gradients, convergence, sparse and dense features agree."""
import numpy as np
import pytest
import scipy.sparse as sp

from ksae_cupy.evaluation import classifier
from ksae_cupy.errors import KsaeError
from gradcheck import numerical_gradient, relative_error


@pytest.mark.parametrize("l2", [0.0, 0.3])
def test_gradients_match_finite_differences(l2):
    rng = np.random.default_rng(0)
    N, H, C = 7, 5, 4
    X_nh = rng.standard_normal((N, H))
    y_n = rng.integers(0, C, N)
    W_hc, b_c = rng.standard_normal((H, C)), rng.standard_normal(C)

    def loss():
        return classifier.loss_and_grads(W_hc, b_c, X_nh, y_n, l2)[0]

    _, dW_hc, db_c = classifier.loss_and_grads(W_hc, b_c, X_nh, y_n, l2)
    assert relative_error(dW_hc, numerical_gradient(loss, W_hc)) < 1e-7
    assert relative_error(db_c, numerical_gradient(loss, b_c)) < 1e-7


def test_loss_is_mean_cross_entropy_plus_penalty():
    X_nh = np.array([[1.0, 0.0], [0.0, 2.0]])
    y_n = np.array([0, 1])
    W_hc = np.array([[1.0, -1.0], [0.5, 0.0]])
    b_c = np.array([0.0, 0.25])
    L = X_nh @ W_hc + b_c
    expected = np.mean(np.log(np.exp(L).sum(1)) - L[[0, 1], y_n]) + 0.5 * 0.1 * np.sum(W_hc ** 2)
    assert classifier.loss_and_grads(W_hc, b_c, X_nh, y_n, 0.1)[0] == pytest.approx(expected, rel=1e-12)


def separable_problem(seed=1, N=600, H=20, C=3):
    rng = np.random.default_rng(seed)
    centres_ch = rng.standard_normal((C, H)) * 4
    y_n = rng.integers(0, C, N)
    X_nh = (centres_ch[y_n] + rng.standard_normal((N, H))).astype(np.float32)
    return X_nh, y_n


def test_learns_a_separable_problem_and_reaches_the_optimum():
    X_nh, y_n = separable_problem()
    model = classifier.fit(X_nh, y_n, 3, l2=1e-3)
    assert model.converged, model.message
    assert classifier.error_rate(model, X_nh, y_n) == 0.0
    # At the optimum the gradient vanishes.
    _, dW_hc, db_c = classifier.loss_and_grads(model.W_hc.astype(np.float64), model.b_c.astype(np.float64),
                                               X_nh.astype(np.float64), y_n, 1e-3)
    assert np.abs(dW_hc).max() < 1e-3 and np.abs(db_c).max() < 1e-3


def test_stronger_l2_shrinks_weights():
    X_nh, y_n = separable_problem()
    weak = classifier.fit(X_nh, y_n, 3, l2=1e-4)
    strong = classifier.fit(X_nh, y_n, 3, l2=10.0)
    assert np.linalg.norm(strong.W_hc) < 0.2 * np.linalg.norm(weak.W_hc)


def test_sparse_features_give_the_same_fit_as_dense():
    rng = np.random.default_rng(2)
    X_nh = np.where(rng.random((300, 40)) < 0.1, rng.random((300, 40)), 0).astype(np.float64)
    y_n = rng.integers(0, 4, 300)
    dense = classifier.fit(X_nh, y_n, 4, l2=1e-2)
    sparse = classifier.fit(sp.csr_matrix(X_nh), y_n, 4, l2=1e-2)
    assert np.allclose(dense.W_hc, sparse.W_hc, atol=1e-5)
    assert np.array_equal(classifier.predict(dense, X_nh), classifier.predict(sparse, sp.csr_matrix(X_nh)))


def test_bad_labels_and_negative_l2_are_user_errors():
    X_nh, y_n = separable_problem(N=30)
    with pytest.raises(KsaeError, match="labels"):
        classifier.fit(X_nh, y_n + 5, 3, l2=0.1)
    with pytest.raises(KsaeError, match="l2"):
        classifier.fit(X_nh, y_n, 3, l2=-1.0)
