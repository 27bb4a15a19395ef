"""The classifier's compiled sparse products: SciPy's sums bit for bit, the gradient checked
numerically in float64, and fits that equal the SciPy path's."""
import numpy as np
import pytest
import scipy.sparse as sp

from ksae_cupy.evaluation import classifier, softmax_kernels
from gradcheck import numerical_gradient, relative_error


def fixed_width_codes(N, H, K, dtype, seed=0):
    """A CSR matrix of N rows holding K distinct units each (in no particular order), as the alpha*k codes are."""
    rng = np.random.default_rng(seed)
    idx_nk = np.stack([rng.permutation(H)[:K] for _ in range(N)]).astype(np.int32)
    val_nk = rng.standard_normal((N, K)).astype(dtype)
    return sp.csr_matrix((val_nk.ravel(), idx_nk.ravel(), np.arange(0, N * K + 1, K)), shape=(N, H))


@pytest.fixture
def numba_path(monkeypatch):
    """The kernels switched on (as ``cpu_path``'s ``numba`` case: skipped, with the reason shown, where the
    ``fast`` extra is missing)."""
    from ksae_cupy.cpu import numba_kernels

    if not numba_kernels.available():
        pytest.skip("Numba is not installed (pip install '.[fast]'): the kernels cannot run")
    monkeypatch.setenv("KSAE_CPU_KERNELS", "1")
    assert softmax_kernels.available()


def test_fixed_width_rows_are_views_of_a_csr_matrix_with_k_entries_per_row():
    X = fixed_width_codes(6, 9, 3, np.float32)
    idx_nk, val_nk = softmax_kernels.fixed_width_rows(X)
    assert idx_nk.shape == val_nk.shape == (6, 3)
    assert np.shares_memory(idx_nk, X.indices) and np.shares_memory(val_nk, X.data)
    assert np.array_equal(np.take_along_axis(X.toarray(), idx_nk.astype(np.intp), axis=1), val_nk)


@pytest.mark.parametrize("X", [
    sp.csr_matrix(np.array([[1.0, 0, 2], [0, 3, 0]])),  # 2 entries, then 1
    sp.csr_matrix((2, 3)),  # no entries
    sp.csc_matrix(np.eye(3)),  # not CSR
    np.eye(3),  # dense
])
def test_fixed_width_rows_is_none_for_any_other_matrix(X):
    assert softmax_kernels.fixed_width_rows(X) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("C", [2, 3, 10])
def test_products_are_scipys_bit_for_bit(numba_path, dtype, C):
    N, H, K = 500, 40, 7
    X = fixed_width_codes(N, H, K, dtype, seed=C)
    rng = np.random.default_rng(1)
    W_hc, b_c = rng.standard_normal((H, C)).astype(dtype), rng.standard_normal(C).astype(dtype)
    G_cn = rng.standard_normal((C, N)).astype(dtype)
    rows = softmax_kernels.fixed_width_rows(X)
    L_cn = softmax_kernels.gather_logits(*rows, W_hc, b_c)
    dW_hc = softmax_kernels.weight_gradient(*rows, G_cn, H)
    assert L_cn.dtype == dW_hc.dtype == dtype
    assert np.array_equal(L_cn, (X @ W_hc + b_c).T)
    assert np.array_equal(dW_hc, X.T @ np.ascontiguousarray(G_cn.T))
    # Units no row holds get a zero gradient row (the output is cleared, not left as allocated).
    unused = np.setdiff1d(np.arange(H), X.indices)
    assert np.all(dW_hc[unused] == 0)


def test_compiling_leaves_numbas_vectorizer_setting_as_it_was(numba_path):
    import numba

    before = numba.config.SLP_VECTORIZE
    X = fixed_width_codes(5, 6, 2, np.float64)
    softmax_kernels.gather_logits(*softmax_kernels.fixed_width_rows(X), np.ones((6, 7)), np.zeros(7))  # 7: a new count
    assert numba.config.SLP_VECTORIZE == before


@pytest.mark.parametrize("l2", [0.0, 0.3])
def test_gradients_through_the_kernels_match_finite_differences(numba_path, l2):
    N, H, K, C = 9, 6, 3, 4
    X = fixed_width_codes(N, H, K, np.float64, seed=3)
    rows = softmax_kernels.fixed_width_rows(X)
    rng = np.random.default_rng(4)
    y_n = rng.integers(0, C, N)
    W_hc, b_c = rng.standard_normal((H, C)), rng.standard_normal(C)

    def loss():
        return classifier.loss_and_grads(W_hc, b_c, X, y_n, l2, rows)[0]

    loss_value, dW_hc, db_c = classifier.loss_and_grads(W_hc, b_c, X, y_n, l2, rows)
    assert loss_value == classifier.loss_and_grads(W_hc, b_c, X.toarray(), y_n, l2)[0]  # the dense reference
    assert relative_error(dW_hc, numerical_gradient(loss, W_hc)) < 1e-7
    assert relative_error(db_c, numerical_gradient(loss, b_c)) < 1e-7


def test_a_fit_is_the_same_with_and_without_the_kernels(numba_path, monkeypatch):
    N, H, K, C = 400, 30, 5, 3
    X = fixed_width_codes(N, H, K, np.float32, seed=5)
    y_n = np.asarray(X @ np.random.default_rng(6).standard_normal((H, C))).argmax(axis=1)  # learnable labels
    fits = {}
    for path in ("1", "0"):  # KSAE_CPU_KERNELS: the kernels, then SciPy's products
        monkeypatch.setenv("KSAE_CPU_KERNELS", path)
        fits[path] = classifier.fit(X, y_n, C, l2=1e-3)
    kernels, scipy_path = fits["1"], fits["0"]
    assert kernels.converged and kernels.n_iter == scipy_path.n_iter
    # The same sums, so the same iterates: the weights are equal, not merely close.
    assert np.array_equal(kernels.W_hc, scipy_path.W_hc) and np.array_equal(kernels.b_c, scipy_path.b_c)
    assert classifier.error_rate(kernels, X, y_n) < 0.1
