"""Hand-written gradients of the k-sparse autoencoder against float64 finite differences."""
import numpy as np
import pytest

from ksae_cupy import model
from ksae_cupy.sparse_step import loss_and_grads_sparse
from gradcheck import matches_finite_differences

# (D, H, k): k = H is a plain linear autoencoder, k = 1 the sparsest code.
SHAPES = [(6, 8, 3), (5, 7, 7), (5, 9, 1), (12, 20, 5)]


def draw_problem(D, H, seed):
    rng = np.random.default_rng(seed)
    params = model.init_params(D, H, sigma=0.5, rng=rng, dtype=np.float64)
    params["b_h"] = rng.standard_normal(H) * 0.1
    params["c_d"] = rng.standard_normal(D) * 0.1
    X_nd = rng.standard_normal((4, D))
    return params, X_nd


# Both steps: the dense reference and the sparse step (ksae_cupy/sparse_step.py), each with
# and without the Numba CPU kernels (the ``cpu_path`` fixture).
STEPS = {"dense": model.loss_and_grads, "sparse": loss_and_grads_sparse}


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("activation", model.ACTIVATIONS)
@pytest.mark.parametrize("topk_method", ["sort", "threshold"])
@pytest.mark.parametrize("D,H,k", SHAPES)
def test_every_parameter_matches_finite_differences(D, H, k, topk_method, activation, step, cpu_path):
    for seed in range(20):  # redraw when the support is not locally constant
        params, X_nd = draw_problem(D, H, seed)

        def loss():
            Xhat_nd, _ = model.forward(params, X_nd, k, topk_method, activation)
            return model.reconstruction_loss(Xhat_nd, X_nd)[0]

        def support():
            # The kept set, and (for ReLU) which kept units are positive: both are kinks.
            Z_nh = model.hidden_preactivations(params, X_nd)
            idx_nk = np.sort(np.argsort(-Z_nh, axis=1, kind="stable")[:, :k], axis=1)
            return np.concatenate([idx_nk, np.take_along_axis(Z_nh, idx_nk, axis=1) > 0], axis=1)

        _, grads, _ = STEPS[step](params, X_nd, k, topk_method, activation)
        if matches_finite_differences(grads, loss, params, model.PARAM_NAMES, unchanged=support):
            return
    pytest.fail("every drawn point sat on a top-k kink; the test cannot check this shape")


def test_gradient_reaches_only_kept_units():
    params, X_nd = draw_problem(6, 10, seed=3)
    _, grads, cache = model.loss_and_grads(params, X_nd, 2)
    # A hidden unit kept by no row of the batch gets no encoder-bias gradient.
    unused_h = np.setdiff1d(np.arange(10), cache.idx_nk.ravel())
    assert unused_h.size > 0
    assert np.all(grads["b_h"][unused_h] == 0)
    assert np.all(grads["W_dh"][:, unused_h] == 0)


def test_relu_zeroes_negative_survivors_and_their_gradient():
    # k = H keeps every unit, so the ReLU alone decides which units carry a value.
    params, X_nd = draw_problem(5, 9, seed=1)
    Z_nh = model.hidden_preactivations(params, X_nd)
    assert (Z_nh < 0).any() and (Z_nh > 0).any()
    _, grads, cache = model.loss_and_grads(params, X_nd, 9, activation="relu")
    np.testing.assert_array_equal(cache.Zs_nh, np.maximum(Z_nh, 0))
    linear = model.loss_and_grads(params, X_nd, 9, activation="linear")[1]
    # A unit negative on every row passes no encoder-bias gradient under ReLU.
    always_negative_h = np.all(Z_nh < 0, axis=0)
    if always_negative_h.any():
        assert np.all(grads["b_h"][always_negative_h] == 0)
    assert not np.allclose(grads["b_h"], linear["b_h"])
    np.testing.assert_array_equal(model.encode(params, X_nd, 9, activation="relu"), np.maximum(Z_nh, 0))


def test_unknown_activation_is_a_one_line_error():
    from ksae_cupy.errors import KsaeError
    params, X_nd = draw_problem(5, 9, seed=1)
    with pytest.raises(KsaeError, match="activation 'tanh' is not allowed; use one of linear, relu"):
        model.forward(params, X_nd, 3, activation="tanh")
