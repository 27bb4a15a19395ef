"""Fine-tuning: gradients against finite differences, frozen phases, resume, learning."""
import numpy as np
import pytest

from ksae_cupy import finetune
from ksae_cupy.backend import CPU
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.estimator import KSparseAutoencoder
from gradcheck import KinkError, numerical_gradient, relative_error

# (D, hidden sizes, kept per layer, classes)
NETS = [(6, [9], [3], 4), (5, [8], [8], 3), (7, [10, 6], [4, 2], 3), (6, [8, 7], [8, 7], 4)]


def draw_net(D, hidden, C, seed):
    rng = np.random.default_rng(seed)
    params = finetune.init_random(D, hidden, C, sigma=0.7, rng=rng, dtype=np.float64)
    for name in params:
        if name.startswith("b"):
            params[name] = rng.standard_normal(params[name].shape) * 0.3
    return params, rng.standard_normal((5, D)), rng.integers(0, C, 5)


def supports(params, X_nd, kept):
    _, cache = finetune.forward(params, X_nd, kept)
    return np.concatenate([np.sort(idx, axis=1).ravel() for idx in cache.idx])


@pytest.mark.parametrize("D,hidden,kept,C", NETS)
def test_every_parameter_matches_finite_differences(D, hidden, kept, C):
    for seed in range(20):  # redraw when a top-k support is not locally constant
        params, X_nd, y_n = draw_net(D, hidden, C, seed)

        def loss():
            return finetune.softmax_cross_entropy(finetune.forward(params, X_nd, kept)[0], y_n)[0]

        _, grads = finetune.loss_and_grads(params, X_nd, y_n, kept)
        try:
            numeric = {n: numerical_gradient(loss, params[n], unchanged=lambda: supports(params, X_nd, kept))
                       for n in params}
        except KinkError:
            continue
        assert set(grads) == set(params)
        for name in params:
            assert grads[name].shape == params[name].shape
            assert relative_error(grads[name], numeric[name]) < 1e-6, name
        return
    pytest.fail("every drawn point sat on a top-k kink")


def test_cross_entropy_matches_direct_formula():
    rng = np.random.default_rng(0)
    S_nc, y_n = rng.standard_normal((7, 4)) * 30, rng.integers(0, 4, 7)  # large logits: stability
    loss, P_nc = finetune.softmax_cross_entropy(S_nc, y_n)
    log_p = S_nc - np.log(np.exp(S_nc - S_nc.max(1, keepdims=True)).sum(1, keepdims=True)) - S_nc.max(1, keepdims=True)
    assert loss == pytest.approx(-log_p[np.arange(7), y_n].mean(), rel=1e-12)
    np.testing.assert_allclose(P_nc.sum(axis=1), 1.0)


@pytest.mark.parametrize("phase", finetune.PHASES)
def test_phase_grads_are_the_full_grads_restricted(phase):
    params, X_nd, y_n = draw_net(7, [10, 6], 3, seed=1)
    _, full = finetune.loss_and_grads(params, X_nd, y_n, [4, 2])
    names = finetune.trainable_names(phase, 2)
    _, part = finetune.loss_and_grads(params, X_nd, y_n, [4, 2], names)
    assert set(part) == set(names)
    for name in names:
        np.testing.assert_allclose(part[name], full[name], rtol=1e-12, atol=1e-15)


# -- training ---------------------------------------------------------------------------------

X_all, y_all, _ = make_sparse_signals(700, D=16, H=24, k=2, n_classes=3, seed=2)
X_tr, y_tr, X_te, y_te = X_all[:500], y_all[:500], X_all[500:], y_all[500:]


def make_trainer(phases, epochs=3, seed=5, hidden=(20, 12), kept=(6, 4)):
    rng = np.random.default_rng(seed)
    params = finetune.init_random(16, list(hidden), 3, sigma=0.1, rng=rng)
    config = finetune.FinetuneConfig(kept=list(kept), phases=list(phases), epochs=epochs, batch_size=40,
                                     lr_start=0.3, lr_end=0.01, momentum=0.5)
    return finetune.FinetuneTrainer(config, CPU, params, rng)


@pytest.mark.parametrize("phase", finetune.PHASES)
def test_frozen_parameters_stay_bit_identical(phase):
    trainer = make_trainer([phase], epochs=2)
    # Negative zeros in every frozen array: a zero update would turn them into +0.0.
    for name, value in trainer.params.items():
        value.ravel()[::3] = -0.0
    before = {n: v.copy() for n, v in trainer.params.items()}
    trainer.fit(X_tr, y_tr)
    trainable = finetune.trainable_names(phase, 2)
    for name, value in trainer.params.items():
        if name in trainable:
            assert not np.array_equal(value, before[name]), name
        else:
            assert value.tobytes() == before[name].tobytes(), name


def test_stopped_mid_epoch_then_resumed_equals_uninterrupted(tmp_path):
    phases = ["softmax", "top", "all"]
    uninterrupted = make_trainer(phases, epochs=2)
    uninterrupted.fit(X_tr, y_tr)

    stopped = make_trainer(phases, epochs=2)

    def stop_in_phase_two(done, total):
        if stopped.phase_index == 1 and stopped.epoch == 1 and done == 4:
            stopped.stop_requested = True

    stopped.fit(X_tr, y_tr, on_batch=stop_in_phase_two)
    assert (stopped.phase_index, stopped.epoch, stopped.batch_in_epoch) == (1, 1, 4)
    from ksae_cupy.finetune_checkpoint import load_finetune_checkpoint, save_finetune_checkpoint

    save_finetune_checkpoint(tmp_path / "f.h5", stopped.state())
    state = load_finetune_checkpoint(tmp_path / "f.h5")
    resumed = finetune.FinetuneTrainer.from_state(state, CPU)
    resumed.fit(X_tr, y_tr)
    assert resumed.step == uninterrupted.step
    for name, value in uninterrupted.params.items():
        assert resumed.params[name].tobytes() == value.tobytes(), name


def test_learns_a_small_labelled_problem_well_above_chance():
    trainer = make_trainer(["all"], epochs=15, hidden=(40,), kept=(10,))
    before = trainer.error(X_te, y_te)
    trainer.fit(X_tr, y_tr)
    after = trainer.error(X_te, y_te)
    # Chance is 2/3 error for three balanced classes.
    assert after < 0.35 and after < before - 0.2, (before, after)


def test_pretrained_stack_initialises_a_deep_net_that_learns():
    from ksae_cupy.pretrain import encoder_of, pretrain_stack

    common = dict(k_start=None, epochs=5, batch_size=50, lr=0.05, sigma=0.1, device="cpu", seed=1)
    ae1, ae2 = pretrain_stack(X_tr, [dict(n_hidden=24, k=4, **common), dict(n_hidden=12, k=3, **common)],
                              code_alpha=2)
    # Layer 2 was trained on the alpha*k-sparse codes of layer 1.
    assert ae2.components_.shape == (12, 24)
    codes = ae1.transform(X_tr[:5], alpha=2)
    assert ((codes != 0).sum(axis=1) <= 8).all()
    rng = np.random.default_rng(0)
    params = finetune.init_from_encoders([encoder_of(ae1), encoder_of(ae2)], 3, 0.01, rng)
    np.testing.assert_array_equal(params["W1_dh"], ae1.components_.T)
    np.testing.assert_array_equal(params["b2_h"], encoder_of(ae2)[1])
    config = finetune.FinetuneConfig(kept=[8, 6], phases=["softmax", "top", "all"], epochs=4, batch_size=40,
                                     lr_start=0.3, lr_end=0.01, momentum=0.5)
    trainer = finetune.FinetuneTrainer(config, CPU, params, rng)
    trainer.fit(X_tr, y_tr)
    assert trainer.finished and trainer.error(X_te, y_te) < 0.4  # chance: 2/3


def test_layers_that_do_not_stack_are_refused():
    from ksae_cupy.errors import KsaeError

    rng = np.random.default_rng(0)
    with pytest.raises(KsaeError, match="do not stack"):
        finetune.init_from_encoders([(np.zeros((4, 6)), np.zeros(6)), (np.zeros((5, 3)), np.zeros(3))], 2, 0.01, rng)
