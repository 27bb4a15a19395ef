"""The step of a stack of models (ksae_cupy/packed_step.py) in float64: its gradients against finite
differences of the summed losses, each model's slice against the dense reference step of that model
alone, and the momentum update per model against the optimizer's."""
import numpy as np
import pytest

from gradcheck import KinkError, numerical_gradient, relative_error
from ksae_cupy import model
from ksae_cupy.momentum_sgd import momentum_update
from ksae_cupy.packed_step import kept_counts, stacked_loss_and_grads, stacked_momentum_update

M, N, D, H = 3, 4, 6, 9


def host_losses(sq_error_m, n: int) -> list[float]:
    """Each model's loss ``0.5/n sum ||Xhat - X||^2``, as model.reconstruction_loss makes it of its sum."""
    return [0.5 * float(value) / n for value in np.asarray(sq_error_m)]


def draw_stack(seed):
    """Three models of one shape (their own weights and biases) and a batch for each, in float64."""
    rng = np.random.default_rng(seed)
    W_mdh = rng.standard_normal((M, D, H)) * 0.5
    b_mh, c_md = rng.standard_normal((M, H)) * 0.1, rng.standard_normal((M, D)) * 0.1
    return W_mdh, b_mh, c_md, rng.standard_normal((M, N, D))


@pytest.mark.parametrize("activation", model.ACTIVATIONS)
@pytest.mark.parametrize("topk_method", ["sort", "threshold"])
@pytest.mark.parametrize("k", [1, 3, H])
def test_stacked_gradients_match_finite_differences(k, topk_method, activation):
    for seed in range(20):  # redraw when a support is not locally constant
        W_mdh, b_mh, c_md, X_mnd = draw_stack(seed)
        arrays = {"W_dh": W_mdh, "b_h": b_mh, "c_d": c_md}

        def total_loss():  # the sum of the models' losses: its gradient is each model's own, side by side
            sq_error_m, _, _, _ = stacked_loss_and_grads(W_mdh, b_mh, c_md, X_mnd, k, topk_method, activation)
            return sum(host_losses(sq_error_m, N))

        def support():
            Z_mnh = X_mnd @ W_mdh + b_mh[:, None, :]
            idx = np.sort(np.argsort(-Z_mnh, axis=2, kind="stable")[:, :, :k], axis=2)
            return np.concatenate([idx, np.take_along_axis(Z_mnh, idx, axis=2) > 0], axis=2)

        _, grads, _, _ = stacked_loss_and_grads(W_mdh, b_mh, c_md, X_mnd, k, topk_method, activation)
        try:
            numeric = {name: numerical_gradient(total_loss, arrays[name], unchanged=support) for name in arrays}
        except KinkError:
            continue
        for name in arrays:
            assert grads[name].shape == arrays[name].shape
            assert relative_error(grads[name], numeric[name]) < 1e-6, name
        return
    pytest.fail("every drawn point sat on a top-k kink")


@pytest.mark.parametrize("activation", model.ACTIVATIONS)
def test_each_slice_is_the_dense_step_of_its_model_alone(activation):
    W_mdh, b_mh, c_md, X_mnd = draw_stack(seed=4)
    sq_error_m, grads, idx_mnk, val_mnk = stacked_loss_and_grads(W_mdh, b_mh, c_md, X_mnd, 3, "sort", activation)
    losses = host_losses(sq_error_m, N)
    kept_mh = kept_counts(idx_mnk, H)
    for m in range(M):
        params = {"W_dh": W_mdh[m], "b_h": b_mh[m], "c_d": c_md[m]}
        loss, alone, cache = model.loss_and_grads(params, X_mnd[m], 3, "sort", activation)
        assert losses[m] == pytest.approx(loss, rel=1e-12)
        for name in model.PARAM_NAMES:
            np.testing.assert_allclose(grads[name][m], alone[name], rtol=1e-12, atol=1e-14, err_msg=name)
        np.testing.assert_array_equal(idx_mnk[m], cache.idx_nk)
        np.testing.assert_array_equal(kept_mh[m], np.bincount(cache.idx_nk.ravel(), minlength=H))


def test_the_update_gives_each_model_its_own_rate_and_momentum_bit_for_bit():
    rng = np.random.default_rng(0)
    theta_m, v_m, grad_m = (rng.standard_normal((M, D, H)).astype(np.float32) for _ in range(3))
    lr_m, momentum_m = np.array([0.01, 0.5, 0.003], np.float32), np.array([0.9, 0.0, 0.5], np.float32)
    want_theta, want_v = theta_m.copy(), v_m.copy()
    for m in range(M):
        momentum_update(want_theta[m], want_v[m], grad_m[m], float(momentum_m[m]), float(lr_m[m]))
    stacked_momentum_update(theta_m, v_m, grad_m, momentum_m, lr_m)
    np.testing.assert_array_equal(theta_m, want_theta)
    np.testing.assert_array_equal(v_m, want_v)
