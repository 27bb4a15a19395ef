"""Baselines: autoencoder gradients with fixed masks, dropout conventions, CD-1, learning, bad input."""
import itertools

import numpy as np
import pytest

from ksae_cupy.supervised import baseline_fit, baselines
from ksae_cupy.errors import KsaeError
from ksae_cupy.momentum_sgd import MomentumSGD
from ksae_cupy.supervised.units import dropout_mask, sigmoid
from gradcheck import numerical_gradient, relative_error


def draw_ae(D=6, H=5, N=4, seed=0):
    rng = np.random.default_rng(seed)
    params = baselines.init_params(D, H, sigma=0.5, rng=rng, dtype=np.float64)
    params["b_h"] = rng.standard_normal(H) * 0.3
    params["c_d"] = rng.standard_normal(D) * 0.3
    return params, rng.random((N, D)), rng


# -- the autoencoder --------------------------------------------------------------------------

# Every baseline autoencoder at the paper's rates (plain, denoising, dropout, dropout + denoising),
# one other pair of rates, and the L2 weight decay the validation grid may choose.
@pytest.mark.parametrize("p_in,p_hid,wd", [(0.0, 0.0, 0.0), (0.2, 0.0, 0.0), (0.0, 0.5, 0.0), (0.2, 0.5, 0.0),
                                           (0.3, 0.4, 0.0), (0.2, 0.5, 0.03), (0.0, 0.0, 0.1)])
def test_autoencoder_gradients_match_finite_differences_for_fixed_masks(p_in, p_hid, wd):
    params, X_nd, rng = draw_ae()
    M_in = dropout_mask(rng, X_nd.shape, p_in, np.float64) if p_in else None
    M_hid = dropout_mask(rng, (X_nd.shape[0], 5), p_hid, np.float64) if p_hid else None
    for M in (M_in, M_hid):
        if M is not None:  # the mask really drops some units and keeps others
            assert 0 < (M == 0).sum() < M.size

    def loss():
        return baselines.ae_loss_and_grads(params, X_nd, M_in, M_hid, wd)[0]

    _, grads = baselines.ae_loss_and_grads(params, X_nd, M_in, M_hid, wd)
    assert set(grads) == set(baselines.PARAM_NAMES)
    for name in baselines.PARAM_NAMES:
        numeric = numerical_gradient(loss, params[name])
        assert grads[name].shape == params[name].shape
        assert relative_error(grads[name], numeric) < 1e-7, name


def test_denoising_loss_reconstructs_the_clean_input():
    params, X_nd, rng = draw_ae()
    M_in = dropout_mask(rng, X_nd.shape, 0.5, np.float64)
    loss, _ = baselines.ae_loss_and_grads(params, X_nd, M_in)
    W, b, c = params["W_dh"], params["b_h"], params["c_d"]
    Xhat = sigmoid((X_nd * M_in) @ W + b) @ W.T + c
    assert loss == pytest.approx(0.5 * ((Xhat - X_nd) ** 2).sum() / len(X_nd), rel=1e-12)


def test_weight_decay_adds_half_its_squared_norm_to_the_loss():
    params, X_nd, rng = draw_ae()
    M_in, M_hid = dropout_mask(rng, X_nd.shape, 0.2, np.float64), dropout_mask(rng, (4, 5), 0.5, np.float64)
    plain, _ = baselines.ae_loss_and_grads(params, X_nd, M_in, M_hid)
    decayed, _ = baselines.ae_loss_and_grads(params, X_nd, M_in, M_hid, weight_decay=0.1)
    assert decayed - plain == pytest.approx(0.05 * (params["W_dh"] ** 2).sum(), rel=1e-12)


def test_features_and_clean_error_use_no_dropout():
    params, X_nd, _ = draw_ae()
    H_nh = 1 / (1 + np.exp(-(X_nd @ params["W_dh"] + params["b_h"])))
    np.testing.assert_allclose(baselines.encode(params, X_nd), H_nh, rtol=1e-12)
    Xhat = H_nh @ params["W_dh"].T + params["c_d"]
    assert baselines.ae_reconstruction_error(params, X_nd) == pytest.approx(
        0.5 * ((Xhat - X_nd) ** 2).sum() / len(X_nd), rel=1e-12)
    W, b = baselines.encoder(params)
    np.testing.assert_array_equal(W, params["W_dh"])
    W[0, 0] += 1  # a copy: fine-tuning cannot change the trained autoencoder
    assert W[0, 0] != params["W_dh"][0, 0]


@pytest.mark.parametrize("p", [0.0, 0.2, 0.5, 0.9])
def test_inverted_dropout_mask_has_expectation_one(p):
    rng = np.random.default_rng(3)
    M = dropout_mask(rng, (400, 500), p, np.float32)
    assert M.dtype == np.float32
    assert set(np.unique(M)) <= {np.float32(0), np.float32(1 / (1 - p))}
    assert (M == 0).mean() == pytest.approx(p, abs=0.005)
    assert M.mean() == pytest.approx(1.0, abs=0.02 if p < 0.9 else 0.05)


def test_sigmoid_is_stable_for_large_inputs():
    Z = np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0])
    with np.errstate(all="raise"):
        S = sigmoid(Z)
    # Absolute accuracy at machine precision (the tanh form trades relative accuracy in the far tail).
    np.testing.assert_allclose(S, [0, 1 / (1 + np.exp(30)), 0.5, 1 / (1 + np.exp(-30)), 1], rtol=0, atol=1e-15)


def low_rank_images(N=600, D=20, seed=0):
    """Values in [0, 1] that lie near a 3-dimensional subspace: something to reconstruct."""
    rng = np.random.default_rng(seed)
    codes = rng.random((N, 3))
    basis = rng.random((3, D))
    return np.clip(codes @ basis / 3 + 0.02 * rng.standard_normal((N, D)), 0, 1)


def test_denoising_autoencoder_lowers_clean_reconstruction_error():
    X = low_rank_images()
    config = baselines.AutoencoderConfig(hidden=16, input_dropout=0.2, epochs=40, batch_size=30, lr=0.02,
                                         momentum=0.9, sigma=0.1, seed=1, dtype="float64")
    initial = baselines.init_params(20, 16, 0.1, np.random.default_rng(1), np.float64)
    before = baselines.ae_reconstruction_error(initial, X)
    reports = []
    params = baseline_fit.fit_autoencoder(X, config, on_epoch=reports.append)
    after = baselines.ae_reconstruction_error(params, X)
    assert [r.epoch for r in reports] == list(range(1, 41)) and reports[-1].step == 40 * 20
    assert after < 0.05 * before, (before, after)


def test_stack_learns_each_layer_on_the_features_of_the_layer_below():
    X = low_rank_images(N=200).astype(np.float32)
    configs = [baselines.AutoencoderConfig(hidden=12, hidden_dropout=0.5, epochs=3, batch_size=50, lr=0.01,
                                           sigma=0.1, seed=1),
               baselines.RBMConfig(hidden=7, epochs=2, batch_size=50, seed=2)]
    seen = []
    stack = baseline_fit.fit_stack(X, configs, on_epoch=lambda l, r: seen.append(l))
    assert seen == [1, 1, 1, 2, 2]
    assert stack[0]["W_dh"].shape == (20, 12) and stack[1]["W_dh"].shape == (12, 7)
    assert stack[1]["W_dh"].dtype == np.float32
    # Layer 2 is what fitting an RBM on layer 1's sigmoid features gives.
    alone = baseline_fit.fit_rbm(baselines.encode(stack[0], X), configs[1])
    np.testing.assert_array_equal(alone["W_dh"], stack[1]["W_dh"])


@pytest.mark.parametrize("kind,p_in,p_hid", [("dropout-ae", 0.0, 0.5), ("denoising-ae", 0.2, 0.0),
                                             ("dropout-denoising-ae", 0.2, 0.5)])
def test_a_baseline_stack_uses_the_papers_dropout(kind, p_in, p_hid, monkeypatch):
    seen = []
    real = baseline_fit.fit_baseline
    monkeypatch.setattr(baseline_fit, "fit_baseline", lambda X, c, *a: seen.append(c) or real(X, c, *a))
    baseline_fit.fit_stack(low_rank_images(N=200), baseline_fit.stack_configs(kind, [6, 4], epochs=1, seed=3))
    assert [(c.hidden, c.input_dropout, c.hidden_dropout, c.seed) for c in seen] == [(6, p_in, p_hid, 3),
                                                                                    (4, p_in, p_hid, 4)]
    # layer 1 the config's defaults, the layers above it their own start (baselines.UPPER_AUTOENCODER)
    assert [(c.lr, c.sigma) for c in seen] == [(0.01, 0.01), (0.01, 0.1)]



def test_stack_configs_give_upper_autoencoder_layers_their_own_start_and_leave_the_rbm_alone():
    """The settings fit_stack receives are stack_configs' (what ksae-finetune --baseline records)."""
    ae = baseline_fit.stack_configs("denoising-ae", [10, 8, 6], epochs=2, seed=5)
    assert [(c.hidden, c.seed, c.lr, c.sigma, c.input_dropout) for c in ae] == [
        (10, 5, 0.01, 0.01, 0.2), (8, 6, 0.01, 0.1, 0.2), (6, 7, 0.01, 0.1, 0.2)]
    rbm = baseline_fit.stack_configs("rbm", [10, 8], epochs=2)
    assert [(c.lr, c.sigma) for c in rbm] == [(0.01, 0.01), (0.01, 0.01)]  # not measured for RBMs: unchanged

def test_unknown_baseline_is_a_one_line_error():
    with pytest.raises(KsaeError, match="baseline 'sae' is not allowed; use one of rbm, dropout-ae, denoising-ae, dropout-denoising-ae"):
        baseline_fit.stack_configs("sae", [2], epochs=1)


def test_an_unknown_model_names_the_parameter_and_a_bad_dropout_rate_its_field():
    from ksae_cupy.errors import OptionError
    from ksae_cupy.supervised.baseline_trainer import config_for

    with pytest.raises(OptionError) as refused:
        config_for("sae")  # ksae-baseline --model spells it --model
    assert (refused.value.field, str(refused.value)) == (
        "model", "model 'sae' is not allowed; use one of rbm, dropout-ae, denoising-ae, dropout-denoising-ae")
    with pytest.raises(OptionError, match=r"^input_dropout 1.5 is not allowed; use a dropout rate 0 <= rate < 1$"):
        baselines.AutoencoderConfig(input_dropout=1.5).validate()


# -- the RBM ------------------------------------------------------------------------------------

def test_cd1_update_equals_the_formula_on_a_tiny_example():
    rng = np.random.default_rng(4)
    D, H, N = 3, 2, 2
    params = {"W_dh": rng.standard_normal((D, H)), "b_h": rng.standard_normal(H), "c_d": rng.standard_normal(D)}
    V0, U = rng.random((N, D)), rng.random((N, H))
    lr, wd = 0.1, 0.01
    # The formula, one example and one weight at a time.
    s = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    W, b, c = params["W_dh"], params["b_h"], params["c_d"]
    dW, db, dc = np.zeros((D, H)), np.zeros(H), np.zeros(D)
    for n in range(N):
        ph0 = [s(b[j] + sum(V0[n, i] * W[i, j] for i in range(D))) for j in range(H)]
        h0 = [1.0 if U[n, j] < ph0[j] else 0.0 for j in range(H)]
        v1 = [s(c[i] + sum(h0[j] * W[i, j] for j in range(H))) for i in range(D)]
        ph1 = [s(b[j] + sum(v1[i] * W[i, j] for i in range(D))) for j in range(H)]
        for i, j in itertools.product(range(D), range(H)):
            dW[i, j] += (V0[n, i] * ph0[j] - v1[i] * ph1[j]) / N
        db += (np.array(ph0) - np.array(ph1)) / N
        dc += (V0[n] - np.array(v1)) / N
    expected = {"W_dh": W + lr * (dW - wd * W), "b_h": b + lr * db, "c_d": c + lr * dc}

    _, grads = baselines.rbm_cd1(params, V0, U, weight_decay=wd)
    updated = {n: v.copy() for n, v in params.items()}
    MomentumSGD(updated, 0.9, np).step(updated, grads, lr)  # first step: zero velocity
    for name in expected:
        np.testing.assert_allclose(updated[name], expected[name], rtol=1e-12, atol=1e-14)


def rbm_free_energy(params, V_nd):
    """``F(v) = -v c - sum_j log(1 + exp(v W + b)_j)`` per row, so that ``p(v) ~ exp(-F(v))``."""
    return -(V_nd @ params["c_d"]) - np.logaddexp(0, V_nd @ params["W_dh"] + params["b_h"]).sum(axis=1)


def exact_mean_log_likelihood(params, V_nd):
    """Mean log p(v) of a tiny RBM, log Z by enumerating every visible state."""
    D = params["W_dh"].shape[0]
    states = np.array(list(itertools.product([0.0, 1.0], repeat=D)))
    neg_F = -rbm_free_energy(params, states)
    log_Z = neg_F.max() + np.log(np.exp(neg_F - neg_F.max()).sum())
    return float((-rbm_free_energy(params, V_nd) - log_Z).mean())


def test_free_energy_matches_summing_out_the_hidden_units():
    rng = np.random.default_rng(5)
    params = {"W_dh": rng.standard_normal((3, 2)), "b_h": rng.standard_normal(2), "c_d": rng.standard_normal(3)}
    v = np.array([[1.0, 0.0, 1.0]])
    total = sum(np.exp(v[0] @ params["c_d"] + np.array(h) @ params["b_h"] + v[0] @ params["W_dh"] @ np.array(h))
                for h in itertools.product([0.0, 1.0], repeat=2))
    assert -rbm_free_energy(params, v)[0] == pytest.approx(np.log(total), rel=1e-12)


def test_cd1_training_raises_the_exact_log_likelihood_of_a_tiny_rbm():
    rng = np.random.default_rng(6)
    prototypes = np.array([[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1], [1, 0, 1, 0, 1, 0]], dtype=float)
    V = prototypes[rng.integers(0, 3, 300)]
    V = np.abs(V - (rng.random(V.shape) < 0.05))  # 5% of the bits flipped
    config = baselines.RBMConfig(hidden=4, epochs=60, batch_size=20, lr=0.1, momentum=0.5, weight_decay=1e-4,
                                 sigma=0.01, seed=2, dtype="float64")
    initial = baselines.init_params(6, 4, 0.01, np.random.default_rng(2), np.float64)
    before = exact_mean_log_likelihood(initial, V)
    params = baseline_fit.fit_rbm(V, config)
    after = exact_mean_log_likelihood(params, V)
    assert before == pytest.approx(6 * np.log(0.5), abs=0.01)  # near-zero weights: uniform over 64 states
    # The data's own entropy bounds the best mean log-likelihood from above (about -2.5 nats).
    assert after > before + 1.0 and after > -2.5, (before, after)


def test_rbm_features_are_its_sigmoid_encoder():
    params, X_nd, _ = draw_ae()
    W, b = baselines.encoder(params)
    np.testing.assert_allclose(baselines.encode(params, X_nd), 1 / (1 + np.exp(-(X_nd @ W + b))), rtol=1e-12)


# -- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("make,fragments", [
    (lambda: baselines.AutoencoderConfig(hidden_dropout=1.0), ["hidden_dropout 1.0", "0 <= rate < 1"]),
    (lambda: baselines.AutoencoderConfig(input_dropout=-0.1), ["input_dropout -0.1", "0 <= rate < 1"]),
    (lambda: baselines.AutoencoderConfig(input_dropout=float("nan")), ["input_dropout nan", "0 <= rate < 1"]),
    (lambda: baselines.AutoencoderConfig(hidden=0), ["hidden 0", "positive"]),
    (lambda: baselines.AutoencoderConfig(lr=0, batch_size=10), ["lr 0", "positive learning rate"]),
    (lambda: baselines.AutoencoderConfig(batch_size=500), ["batch_size 500", "at most the 100"]),
    (lambda: baselines.RBMConfig(weight_decay=-1.0), ["weight_decay -1.0", ">= 0"]),
    (lambda: baselines.AutoencoderConfig(weight_decay=float("inf")), ["weight_decay inf", ">= 0"]),
    (lambda: baselines.RBMConfig(momentum=1.0, batch_size=10), ["momentum 1.0", "0 <= momentum < 1"]),
])
def test_bad_options_are_one_line_errors(make, fragments):
    X = np.random.default_rng(0).random((100, 4))
    fit = baseline_fit.fit_rbm if isinstance(make(), baselines.RBMConfig) else baseline_fit.fit_autoencoder
    with pytest.raises(KsaeError) as info:
        fit(X, make())
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_rbm_refuses_values_outside_zero_one():
    X = np.random.default_rng(0).standard_normal((50, 4))
    with pytest.raises(KsaeError, match=r"values in \[-.*only values in \[0, 1\] are allowed"):
        baseline_fit.fit_rbm(X, baselines.RBMConfig(hidden=3, epochs=1, batch_size=10))


def test_input_that_is_not_a_matrix_is_refused():
    with pytest.raises(KsaeError, match=r"shape \(10,\); only an N x D array"):
        baseline_fit.fit_autoencoder(np.zeros(10), baselines.AutoencoderConfig(epochs=1, batch_size=5))
