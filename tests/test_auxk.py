"""The AuxK loss (beyond the paper, issue 35): hand-written gradients against float64 finite differences,
the sparse step against the dense reference, and the W update by two row scatters against the dense update."""
import numpy as np
import pytest

from ksae_cupy import model
from ksae_cupy.auxk_step import GradientWithDeadRows, loss_and_grads_sparse_auxk
from ksae_cupy.cpu import momentum as cpu_momentum
from ksae_cupy.momentum_sgd import MomentumSGD
from ksae_cupy.sparse_step import loss_and_grads_sparse, sparse_layout
from gradcheck import matches_finite_differences

# (D, H, k, aux_k, dead units): aux_k below, equal to and above the number of dead units.
SHAPES = [(6, 12, 3, 2, 5), (5, 10, 2, 4, 4), (7, 14, 3, 9, 6), (12, 20, 5, 3, 12)]
STEPS = {"dense": model.loss_and_grads_auxk, "sparse": loss_and_grads_sparse_auxk}


def draw_problem(D, H, n_dead, seed, N=4):
    rng = np.random.default_rng(seed)
    params = model.init_params(D, H, sigma=0.5, rng=rng, dtype=np.float64)
    params["b_h"] = rng.standard_normal(H) * 0.1
    params["c_d"] = rng.standard_normal(D) * 0.1
    X_nd = rng.standard_normal((N, D))
    dead_h = np.zeros(H, dtype=bool)
    dead_h[rng.choice(H, n_dead, replace=False)] = True
    return params, X_nd, dead_h


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("activation", model.ACTIVATIONS)
@pytest.mark.parametrize("topk_method", ["sort", "threshold"])
@pytest.mark.parametrize("D,H,k,aux_k,n_dead", SHAPES)
def test_every_parameter_matches_finite_differences(D, H, k, aux_k, n_dead, topk_method, activation, step, cpu_path):
    coef = 0.3
    for seed in range(20):  # redraw when a top-k support is not locally constant
        params, X_nd, dead_h = draw_problem(D, H, n_dead, seed)
        # e = X - Xhat at the point itself: a constant of the auxiliary loss (no gradient flows into it).
        Xhat_nd, _ = model.forward(params, X_nd, k, topk_method, activation)
        e_nd = X_nd - Xhat_nd
        a = min(aux_k, n_dead)

        def loss():
            Xhat_nd, _ = model.forward(params, X_nd, k, topk_method, activation)
            main = model.reconstruction_loss(Xhat_nd, X_nd)[0]
            Z_nh = model.hidden_preactivations(params, X_nd)
            Zd_nh = np.where(dead_h, Z_nh, -np.inf)  # the live units masked out
            idx_na = np.argsort(-Zd_nh, axis=1, kind="stable")[:, :a]
            val_na = np.take_along_axis(Z_nh, idx_na, axis=1)
            if activation == "relu":
                val_na = np.maximum(val_na, 0)
            ehat_nd = model.scatter_rows(idx_na, val_na, H) @ params["W_dh"].T
            return main + coef * 0.5 * np.sum((e_nd - ehat_nd) ** 2) / len(X_nd)

        def support():
            Z_nh = model.hidden_preactivations(params, X_nd)
            idx_nk = np.sort(np.argsort(-Z_nh, axis=1, kind="stable")[:, :k], axis=1)
            idx_na = np.sort(np.argsort(-np.where(dead_h, Z_nh, -np.inf), axis=1, kind="stable")[:, :a], axis=1)
            kept = np.concatenate([idx_nk, idx_na], axis=1)
            return np.concatenate([kept, np.take_along_axis(Z_nh, kept, axis=1) > 0], axis=1)

        p = dict(params, W_dh=sparse_layout(params["W_dh"])) if step == "sparse" else params
        main_loss, aux_loss, grads, _ = STEPS[step](p, X_nd, k, dead_h, aux_k, coef, topk_method, activation)
        if not matches_finite_differences(grads, loss, params, model.PARAM_NAMES, unchanged=support):
            continue
        assert main_loss + aux_loss == pytest.approx(loss(), rel=1e-12)
        assert aux_loss > 0
        return
    pytest.fail("every drawn point sat on a top-k kink; the test cannot check this shape")


@pytest.mark.parametrize("activation", model.ACTIVATIONS)
def test_sparse_step_equals_the_dense_reference_in_float32(activation, cpu_path):
    rng = np.random.default_rng(5)
    D, H, N, k = 40, 120, 32, 6
    params = model.init_params(D, H, 0.1, rng)
    params["b_h"] = (rng.standard_normal(H) * 0.1).astype(np.float32)
    X_nd = rng.random((N, D), dtype=np.float32)
    dead_h = rng.random(H) < 0.3
    dense = model.loss_and_grads_auxk(params, X_nd, k, dead_h, 16, 1 / 32, "sort", activation)
    sparse = loss_and_grads_sparse_auxk(dict(params, W_dh=sparse_layout(params["W_dh"])), X_nd, k, dead_h, 16,
                                        1 / 32, "sort", activation)
    assert sparse[0] == pytest.approx(dense[0], rel=1e-5) and sparse[1] == pytest.approx(dense[1], rel=1e-5)
    np.testing.assert_array_equal(sparse[3].idx_nk, dense[3].idx_nk)
    for name in model.PARAM_NAMES:
        scale = float(np.abs(dense[2][name]).max())
        np.testing.assert_allclose(np.asarray(sparse[2][name]), dense[2][name], rtol=0, atol=1e-5 * scale,
                                   err_msg=name)


def test_deferred_update_by_two_scatters_equals_the_dense_update():
    from ksae_cupy.cpu import numba_kernels as kernels

    if not kernels.enabled():
        pytest.skip("Numba is not installed (pip install '.[fast]'): the CPU kernels cannot run")
    rng = np.random.default_rng(2)
    D, H, N, k = 30, 80, 20, 5
    params = model.init_params(D, H, 0.1, rng, np.float64)
    X_nd = rng.random((N, D))
    dead_h = rng.random(H) < 0.4
    start = {name: sparse_layout(v) if name == "W_dh" else v.copy() for name, v in params.items()}
    results = []
    for defer in (True, False):
        p = {name: v.copy(order="K") for name, v in start.items()}
        opt = MomentumSGD(p, 0.9, np)
        for name in opt.velocities:  # a velocity that is not zero, so m v counts
            opt.velocities[name][...] = rng.standard_normal(opt.velocities[name].shape) * 1e-3 if defer else \
                results[0][1][name]
        v0 = {name: v.copy() for name, v in opt.velocities.items()}
        _, _, grads, _ = loss_and_grads_sparse_auxk(p, X_nd, k, dead_h, 7, 0.5, defer_weight_gradient=defer)
        assert isinstance(grads["W_dh"], GradientWithDeadRows) == defer
        # The trainer's update on the CPU kernels: W's gradient in parts applied row by row, or as an array.
        (cpu_momentum.rows_step if defer else cpu_momentum.fused_step)(opt, p, grads, 0.05)
        results.append((p, v0))
    for name in model.PARAM_NAMES:
        np.testing.assert_allclose(results[0][0][name], results[1][0][name], rtol=0, atol=1e-14, err_msg=name)


def test_no_dead_unit_is_the_plain_step(cpu_path):
    params, X_nd, _ = draw_problem(8, 16, 0, seed=1)
    dead_h = np.zeros(16, dtype=bool)
    for step, plain in ((model.loss_and_grads_auxk, model.loss_and_grads),
                        (loss_and_grads_sparse_auxk, loss_and_grads_sparse)):
        loss, aux_loss, grads, _ = step(params, X_nd, 3, dead_h, 4, 1 / 32)
        loss_plain, grads_plain, _ = plain(params, X_nd, 3)
        assert (loss, aux_loss) == (loss_plain, 0.0)
        for name in model.PARAM_NAMES:
            np.testing.assert_array_equal(np.asarray(grads[name]), np.asarray(grads_plain[name]))


def test_only_dead_units_are_selected_and_at_most_aux_k():
    rng = np.random.default_rng(0)
    Z_nh = rng.standard_normal((6, 20))
    dead_h = np.zeros(20, dtype=bool)
    dead_h[[1, 4, 7, 8, 15]] = True
    idx_na, val_na = model.select_dead_units(Z_nh, dead_h, 3)
    assert idx_na.shape == (6, 3) and set(idx_na.ravel()) <= {1, 4, 7, 8, 15}
    expected = np.sort(np.argsort(-np.where(dead_h, Z_nh, -np.inf), axis=1)[:, :3], axis=1)
    np.testing.assert_array_equal(np.sort(idx_na, axis=1), expected)
    np.testing.assert_array_equal(val_na, np.take_along_axis(Z_nh, idx_na, axis=1))
    assert model.select_dead_units(Z_nh, dead_h, 50)[0].shape == (6, 5)  # all 5 dead units
    assert model.select_dead_units(Z_nh, np.zeros(20, dtype=bool), 3) is None
