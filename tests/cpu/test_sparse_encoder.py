"""The encoder from the non-zero inputs (ksae_cupy/cpu/sparse_encoder.py) against BLAS's X W, and in training."""
import numpy as np
import pytest

from ksae_cupy import model
from ksae_cupy.cpu import numba_kernels as kernels
from ksae_cupy.cpu import sparse_encoder
from ksae_cupy.cpu.sparse_encoder import RunInputs, SparseInputs, encode_rows, takes_sparse_encoder
from ksae_cupy.errors import KsaeError

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason="Numba is not installed (pip install '.[fast]'): the CPU kernels cannot run")


def _sparse_inputs(N, D, density, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    X_nd = (rng.random((N, D)) * (rng.random((N, D)) < density)).astype(dtype)
    X_nd[0] = 0  # an example without a non-zero input
    X_nd[1, :] = 0
    X_nd[1, 3] = 0.5  # one with fewer non-zeros than a pass of four takes
    return X_nd


def _weights(D, H, seed, dtype=np.float32, order="F"):
    rng = np.random.default_rng(seed)
    return (np.asarray(rng.standard_normal((D, H)), dtype=dtype, order=order),
            rng.standard_normal(H).astype(dtype))


def test_the_csr_form_is_scipys():
    import scipy.sparse

    X_nd = _sparse_inputs(50, 37, 0.2, seed=1)
    X_nd[4, 6] = np.nan  # NaN is a non-zero input: it must reach the product
    inputs = SparseInputs.of(X_nd)
    expected = scipy.sparse.csr_matrix(X_nd)
    np.testing.assert_array_equal(inputs.indptr_n, expected.indptr)
    np.testing.assert_array_equal(inputs.indices_z, expected.indices)
    np.testing.assert_array_equal(inputs.values_z, expected.data)
    assert inputs.density == pytest.approx(expected.nnz / X_nd.size)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-13)])
@pytest.mark.parametrize("D, H", [(784, 1000), (37, 300), (5, 7), (40, sparse_encoder.TILE)])
def test_the_product_equals_blas_within_rounding(dtype, rtol, D, H):
    X_nd = _sparse_inputs(70, D, 0.2, seed=2, dtype=dtype)
    W_dh, b_h = _weights(D, H, seed=3, dtype=dtype)
    row_ids = np.random.default_rng(4).permutation(70)[:45]  # a minibatch: some rows, in any order
    Z_nh = encode_rows(SparseInputs.of(X_nd).rows(row_ids), W_dh, b_h)
    expected = X_nd[row_ids].astype(np.float64) @ W_dh.astype(np.float64) + b_h
    scale = np.abs(X_nd[row_ids]).astype(np.float64) @ np.abs(W_dh).astype(np.float64) + np.abs(b_h)
    assert np.all(np.abs(Z_nh - expected) <= rtol * scale)
    np.testing.assert_array_equal(Z_nh[0 if row_ids[0] == 0 else np.flatnonzero(row_ids == 0)[0]], b_h)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_same_bits_at_any_lane_count_and_either_layout_of_w(dtype):
    X_nd = _sparse_inputs(90, 61, 0.3, seed=5, dtype=dtype)
    W_dh, b_h = _weights(61, 3 * sparse_encoder.TILE + 17, seed=6, dtype=dtype)
    rows = SparseInputs.of(X_nd).rows(np.arange(90)[::-1])
    one = encode_rows(rows, W_dh, b_h, lanes=1)
    for lanes in (2, 3, 5):
        np.testing.assert_array_equal(encode_rows(rows, W_dh, b_h, lanes), one)
    np.testing.assert_array_equal(encode_rows(rows, np.ascontiguousarray(W_dh), b_h, 2), one)


def test_the_sparse_step_with_the_sparse_encoder_gives_the_float64_gradients():
    """Only Z changes its order of summation: float64 gradients equal the dense reference's to rounding."""
    from ksae_cupy.sparse_step import loss_and_grads_sparse, sparse_layout

    X_nd = _sparse_inputs(40, 30, 0.25, seed=7, dtype=np.float64)
    params = model.init_params(30, 90, 0.3, np.random.default_rng(8), np.float64)
    loss, grads, _ = model.loss_and_grads(params, X_nd, 7, "sort")
    params_f = dict(params, W_dh=sparse_layout(params["W_dh"]))
    for lanes in (1, 2):
        got_loss, got, _ = loss_and_grads_sparse(params_f, X_nd, 7, "sort", lanes=lanes,
                                                 X_rows=SparseInputs.of(X_nd).rows(np.arange(40)))
        assert got_loss == pytest.approx(loss, rel=1e-12)
        for name in model.PARAM_NAMES:
            np.testing.assert_allclose(np.asarray(got[name]), grads[name], rtol=1e-10, atol=1e-13, err_msg=name)


def test_rows_of_another_batch_are_refused():
    from ksae_cupy.sparse_step import loss_and_grads_sparse, sparse_layout

    X_nd = _sparse_inputs(20, 12, 0.3, seed=9)
    params = model.init_params(12, 30, 0.3, np.random.default_rng(10), np.float32)
    params["W_dh"] = sparse_layout(params["W_dh"])
    with pytest.raises(ValueError, match="X_rows holds 5 examples, X_nd 20"):
        loss_and_grads_sparse(params, X_nd, 3, X_rows=SparseInputs.of(X_nd).rows(np.arange(5)))


def test_dense_inputs_keep_blas_and_sparse_ones_take_the_encoder(monkeypatch):
    monkeypatch.delenv("KSAE_ENCODER", raising=False)
    assert takes_sparse_encoder(0.19) and not takes_sparse_encoder(0.9)
    assert not takes_sparse_encoder(sparse_encoder.MAX_DENSITY + 0.01)
    assert takes_sparse_encoder(0.9, "sparse") and not takes_sparse_encoder(0.01, "dense")
    rng = np.random.default_rng(11)
    dense_nd = rng.random((64, 20), dtype=np.float32) + 0.1
    sparse_nd = _sparse_inputs(64, 20, 0.1, seed=12)
    inputs = RunInputs(applies=True)
    assert inputs.of(dense_nd, np.float32) is None  # BLAS's product
    built = inputs.of(sparse_nd, np.float32)
    assert isinstance(built, SparseInputs) and built.shape == (64, 20)
    assert inputs.of(sparse_nd, np.float32) is built  # built once per set
    assert inputs.of(sparse_nd.astype(np.float64), np.float32) is None  # not the parameters' dtype
    assert RunInputs(applies=False).of(sparse_nd, np.float32) is None
    monkeypatch.setenv("KSAE_ENCODER", "dense")
    assert RunInputs(applies=True).of(sparse_nd, np.float32) is None
    monkeypatch.setenv("KSAE_ENCODER", "sparse")
    assert RunInputs(applies=True).of(dense_nd, np.float32) is not None
    monkeypatch.setenv("KSAE_ENCODER", "fast")
    with pytest.raises(KsaeError, match="KSAE_ENCODER 'fast' is not allowed; use one of dense, sparse, auto"):
        RunInputs(applies=True).of(sparse_nd, np.float32)


def _train(monkeypatch, encoder, threads, X_train, X_valid, epochs=2):
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    monkeypatch.setenv("KSAE_ENCODER", encoder)
    kernels.set_threads(threads)
    try:
        trainer = Trainer(TrainConfig(hidden=300, k=10, k_start=20, epochs=epochs, batch_size=32, step="sparse",
                                      lr=0.05), resolve_device("cpu"), D=X_train.shape[1])
        reports = [trainer.run_epoch(X_train, X_valid) for _ in range(epochs)]
    finally:
        kernels.set_threads(None)
    return trainer, [(r.train_loss, r.valid_loss) for r in reports]


def test_training_with_the_sparse_encoder_equals_training_with_blas(monkeypatch):
    X_nd = _sparse_inputs(320, 50, 0.2, seed=13)
    X_train, X_valid = X_nd[:256], X_nd[256:]
    encoded = []  # the examples each call of the sparse encoder took

    def counted(X_rows, *args):
        encoded.append(X_rows.row_ids.shape[0])
        return encode_rows(X_rows, *args)

    monkeypatch.setattr(sparse_encoder, "encode_rows", counted)
    blas, blas_losses = _train(monkeypatch, "dense", 1, X_train, X_valid)
    assert encoded == []
    ours, our_losses = _train(monkeypatch, "auto", 1, X_train, X_valid)
    assert encoded == 2 * ([32] * 8 + [64])  # every batch, and the validation pass, of both epochs
    assert np.allclose(our_losses, blas_losses, rtol=1e-4)
    for name in model.PARAM_NAMES:
        np.testing.assert_allclose(ours.params[name], blas.params[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_training_with_the_sparse_encoder_is_bit_identical_on_one_and_two_threads(monkeypatch):
    X_nd = _sparse_inputs(320, 50, 0.2, seed=14)
    one, one_losses = _train(monkeypatch, "sparse", 1, X_nd[:256], X_nd[256:])
    two, two_losses = _train(monkeypatch, "sparse", 2, X_nd[:256], X_nd[256:])
    assert one_losses == two_losses
    for name in model.PARAM_NAMES:
        np.testing.assert_array_equal(two.params[name], one.params[name], err_msg=name)


def test_a_dense_set_is_only_counted_never_converted(monkeypatch):
    monkeypatch.delenv("KSAE_ENCODER", raising=False)

    def refuse(*args, **kwargs):
        raise AssertionError("a dense set was converted to CSR")

    monkeypatch.setattr(SparseInputs, "of", refuse)
    dense_nd = np.random.default_rng(15).random((40, 30), dtype=np.float32) + 0.1
    assert RunInputs(applies=True).of(dense_nd, np.float32) is None


def test_the_training_set_stays_known_while_other_sets_are_evaluated():
    """The progress estimate evaluates a sample during the first epoch: the training set's CSR stays."""
    train_nd, valid_nd, sample_nd, other_nd = (_sparse_inputs(30, 20, 0.1, seed=s) for s in (16, 17, 18, 19))
    inputs = RunInputs(applies=True)
    train = inputs.of(train_nd, np.float32)
    valid = inputs.of(valid_nd, np.float32, "evaluation")
    inputs.of(sample_nd, np.float32, "evaluation")
    assert inputs.of(train_nd, np.float32) is train
    assert inputs.of(valid_nd, np.float32, "evaluation") is valid
    inputs.of(other_nd, np.float32, "evaluation")  # the sample goes, the validation set (used last) stays
    assert inputs.of(valid_nd, np.float32, "evaluation") is valid
