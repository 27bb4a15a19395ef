"""Fine-tuning: gradients against finite differences, frozen phases, resume, learning."""
import numpy as np
import pytest

from ksae_cupy.supervised import finetune
from ksae_cupy.backend import CPU
from ksae_cupy.datasets.synthetic import make_sparse_signals
from gradcheck import matches_finite_differences

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
        assert set(grads) == set(params)
        if matches_finite_differences(grads, loss, params, unchanged=lambda: supports(params, X_nd, kept)):
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


# Network variants of the training tests: k-sparse with the sparse and the dense step, and sigmoid
# layers with both dropouts (always the dense step).
VARIANTS = {"ksparse": dict(step="sparse"), "ksparse-dense": dict(step="dense"),
            "sigmoid+dropout": dict(kept=(None, None), activations=["sigmoid", "sigmoid"], input_dropout=0.2,
                                    hidden_dropout=0.5)}


def make_trainer(phases, epochs=3, seed=5, hidden=(20, 12), kept=(6, 4), activations=None, input_dropout=0.0,
                 hidden_dropout=0.0, step="auto"):
    rng = np.random.default_rng(seed)
    params = finetune.init_random(16, list(hidden), 3, sigma=0.1, rng=rng)
    config = finetune.FinetuneConfig(kept=list(kept), activations=activations, input_dropout=input_dropout,
                                     hidden_dropout=hidden_dropout, phases=list(phases), epochs=epochs,
                                     batch_size=40, lr_start=0.3, lr_end=0.01, momentum=0.5, step=step)
    return finetune.FinetuneTrainer(config, CPU, params, rng)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("phase", finetune.PHASES)
def test_frozen_parameters_stay_bit_identical(phase, variant):
    trainer = make_trainer([phase], epochs=2, **VARIANTS[variant])
    # Negative zeros in every frozen array: a zero update would turn them into +0.0.
    for name, value in trainer.params.items():
        value.ravel(order="K")[::3] = -0.0  # in memory order: a view also of the sparse step's Fortran-ordered W1
    before = {n: v.copy() for n, v in trainer.params.items()}
    trainer.fit(X_tr, y_tr)
    trainable = finetune.trainable_names(phase, 2)
    for name, value in trainer.params.items():
        if name in trainable:
            assert not np.array_equal(value, before[name]), name
        else:
            assert value.tobytes() == before[name].tobytes(), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_stopped_mid_epoch_then_resumed_equals_uninterrupted(tmp_path, variant):
    phases = ["softmax", "top", "all"]
    uninterrupted = make_trainer(phases, epochs=2, **VARIANTS[variant])
    uninterrupted.fit(X_tr, y_tr)

    stopped = make_trainer(phases, epochs=2, **VARIANTS[variant])
    assert stopped.step_kind == ("sparse" if variant == "ksparse" else "dense")

    def stop_in_phase_two(done, total):
        if stopped.phase_index == 1 and stopped.epoch == 1 and done == 4:
            stopped.stop_requested = True

    stopped.fit(X_tr, y_tr, on_batch=stop_in_phase_two)
    assert (stopped.phase_index, stopped.epoch, stopped.batch_in_epoch) == (1, 1, 4)
    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint, save_finetune_checkpoint

    save_finetune_checkpoint(tmp_path / "f.h5", stopped.state())
    state = load_finetune_checkpoint(tmp_path / "f.h5")
    resumed = finetune.FinetuneTrainer.from_state(state, CPU)
    assert resumed.config == stopped.config and resumed.step_kind == stopped.step_kind
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
    from ksae_cupy.supervised.pretrain import encoder_of
    from ksae_cupy.training.estimator import KSparseAutoencoder

    common = dict(k_start=None, epochs=5, batch_size=50, lr=0.05, sigma=0.1, device="cpu", seed=1)
    ae1 = KSparseAutoencoder(n_hidden=24, k=4, **common).fit(X_tr)
    ae2 = KSparseAutoencoder(n_hidden=12, k=3, **common).fit(ae1.transform(X_tr, alpha=2))
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


# -- sigmoid layers and dropout ------------------------------------------------------------------

# (D, hidden sizes, kept, activations, classes, input dropout, hidden dropout)
SIGMOID_NETS = [
    (6, [9], [None], ["sigmoid"], 4, 0.0, 0.0),
    (6, [9], [None], ["sigmoid"], 4, 0.2, 0.5),
    (7, [10, 6], [None, None], ["sigmoid", "sigmoid"], 3, 0.3, 0.5),
    (7, [10, 6], [4, None], ["ksparse", "sigmoid"], 3, 0.2, 0.5),
    (7, [10, 6], [None, 3], ["sigmoid", "ksparse"], 3, 0.0, 0.4),
    (6, [9], [None], ["relu"], 4, 0.0, 0.0),  # the plain net of Table fn_mnist's "without pre-training"
    (7, [10, 6], [None, None], ["relu", "relu"], 3, 0.2, 0.5),
    (7, [10, 6], [4, None], ["ksparse", "relu"], 3, 0.0, 0.0),
]


@pytest.mark.parametrize("D,hidden,kept,activations,C,p_in,p_hid", SIGMOID_NETS)
def test_sigmoid_and_dropout_nets_match_finite_differences(D, hidden, kept, activations, C, p_in, p_hid):
    for seed in range(20):  # redraw when a top-k support is not locally constant
        params, X_nd, y_n = draw_net(D, hidden, C, seed)
        masks = finetune.draw_masks(np.random.default_rng(seed), 5, [D, *hidden], p_in, p_hid, CPU, np.float64)
        assert (masks is None) == (p_in == 0 and p_hid == 0)

        def loss():
            return finetune.softmax_cross_entropy(finetune.forward(params, X_nd, kept, "sort", activations, masks)[0],
                                                  y_n)[0]

        def support():
            _, cache = finetune.forward(params, X_nd, kept, "sort", activations, masks)
            return np.concatenate([np.sort(i, axis=1).ravel() for i in cache.idx if i is not None] + [np.zeros(0)])

        _, grads = finetune.loss_and_grads(params, X_nd, y_n, kept, None, "sort", activations, masks)
        assert set(grads) == set(params)
        if matches_finite_differences(grads, loss, params, unchanged=support):
            return
    pytest.fail("every drawn point sat on a top-k kink")


def test_masks_change_the_training_loss_but_prediction_uses_none():
    trainer = make_trainer(["all"], **VARIANTS["sigmoid+dropout"])
    cfg, X_nd, y_n = trainer.config, X_te, y_te
    masks = finetune.draw_masks(np.random.default_rng(0), len(X_nd), trainer.sizes, 0.2, 0.5, CPU)
    with_masks = finetune.loss_and_grads(trainer.params, X_nd, y_n, cfg.kept, None, "sort", cfg.activations, masks)
    without = finetune.loss_and_grads(trainer.params, X_nd, y_n, cfg.kept, None, "sort", cfg.activations)
    assert with_masks[0] != without[0]
    logits, _ = finetune.forward(trainer.params, X_nd, cfg.kept, "sort", cfg.activations)
    expected = np.mean(np.argmax(logits, axis=1) != y_n)
    state = trainer.rng.bit_generator.state
    assert trainer.error(X_nd, y_n) == trainer.error(X_nd, y_n) == pytest.approx(expected, abs=0)
    assert trainer.rng.bit_generator.state == state  # prediction draws no masks


def test_no_dropout_draws_nothing_from_the_generator():
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    assert finetune.draw_masks(rng, 4, [3, 5], 0.0, 0.0, CPU) is None
    assert rng.bit_generator.state == state
    masks = finetune.draw_masks(rng, 4, [3, 5, 2], 0.0, 0.5, CPU)
    assert masks[0] is None and masks[1].shape == (4, 5) and masks[2].shape == (4, 2)


def test_sigmoid_net_with_dropout_learns_a_small_labelled_problem():
    trainer = make_trainer(["all"], epochs=15, hidden=(40,), kept=(None,), activations=["sigmoid"],
                           input_dropout=0.2, hidden_dropout=0.5)
    trainer.config.lr_start = 1.0
    before = trainer.error(X_te, y_te)
    trainer.fit(X_tr, y_tr)
    after = trainer.error(X_te, y_te)
    assert after < 0.35 and after < before - 0.2, (before, after)  # chance: 2/3


def test_relu_net_learns_a_small_labelled_problem_and_zeroes_negative_units():
    trainer = make_trainer(["all"], epochs=15, hidden=(40,), kept=(None,), activations=["relu"])
    _, cache = finetune.forward(trainer.params, X_te, [None], "sort", ["relu"])
    assert cache.S[0].min() == 0 and (cache.S[0] == 0).any() and (cache.S[0] > 0).any()
    before = trainer.error(X_te, y_te)
    trainer.fit(X_tr, y_tr)
    after = trainer.error(X_te, y_te)
    assert after < 0.35 and after < before - 0.2, (before, after)  # chance: 2/3


def test_softmax_lr_start_sets_the_softmax_phase_rate_and_no_other():
    """Each phase's rate falls linearly from its first rate to lr_end; softmax_lr_start is the softmax
    phase's first rate, lr_start every other phase's."""
    rng = np.random.default_rng(0)
    X, y = rng.random((80, 16)), rng.integers(0, 3, 80)
    trainer = make_trainer(["softmax", "top", "all"], epochs=3)
    trainer.config.softmax_lr_start = 0.05
    rates = {}
    trainer.fit(X, y, on_epoch=lambda r: rates.setdefault(r.phase, []).append(r.lr))
    assert rates["softmax"] == pytest.approx([0.05, 0.03, 0.01])  # 0.05 -> 0.01 over 3 epochs
    assert rates["top"] == pytest.approx([0.3, 0.155, 0.01]) and rates["all"] == rates["top"]
    plain = make_trainer(["softmax", "top", "all"], epochs=3)
    plain.fit(X, y, on_epoch=lambda r: rates.setdefault("plain " + r.phase, []).append(r.lr))
    assert rates["plain softmax"] == rates["top"]  # unset: the paper's one schedule for every phase


def test_momentum_end_ramps_the_momentum_in_each_phase_and_the_update_uses_it():
    """--momentum-end: the momentum rises linearly from --momentum over --momentum-epochs (default: the
    phase's epochs), then stays; each phase starts the ramp again, as it does the rate."""
    rng = np.random.default_rng(0)
    X, y = rng.random((80, 16)), rng.integers(0, 3, 80)
    trainer = make_trainer(["top", "all"], epochs=4)
    trainer.config.momentum_end = 0.8
    seen = {}
    trainer.fit(X, y, on_epoch=lambda r: seen.setdefault(r.phase, []).append(r.momentum))
    assert seen["top"] == pytest.approx([0.5, 0.6, 0.7, 0.8]) and seen["all"] == seen["top"]
    short = make_trainer(["all"], epochs=4)
    short.config.momentum_end, short.config.momentum_epochs = 0.8, 2
    short.fit(X, y, on_epoch=lambda r: seen.setdefault("short", []).append(r.momentum))
    assert seen["short"] == pytest.approx([0.5, 0.8, 0.8, 0.8])
    plain = make_trainer(["all"], epochs=4)
    plain.fit(X, y, on_epoch=lambda r: seen.setdefault("plain", []).append(r.momentum))
    assert seen["plain"] == [0.5] * 4  # unset: the paper's one momentum throughout

    # The update applies the epoch's momentum: epoch 1 (momentum 0.5 on either) is the same to the bit,
    # epoch 2 is not, and it is what a constant 0.8 from the same state would do.
    ramped, constant = make_trainer(["all"], epochs=2), make_trainer(["all"], epochs=2)
    ramped.config.momentum_end = 0.8
    for trainer in (ramped, constant):
        trainer.run_epoch(X, y)
    assert all(ramped.params[n].tobytes() == constant.params[n].tobytes() for n in ramped.params)
    constant.config.momentum = 0.8  # the second epoch of the ramp
    for trainer in (ramped, constant):
        trainer.run_epoch(X, y)
    assert all(ramped.params[n].tobytes() == constant.params[n].tobytes() for n in ramped.params)
    unramped = make_trainer(["all"], epochs=2)
    unramped.fit(X, y)
    assert not np.array_equal(unramped.params["W1_dh"], ramped.params["W1_dh"])


def test_stopped_mid_ramp_then_resumed_equals_uninterrupted(tmp_path):
    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint, save_finetune_checkpoint

    def ramped():
        trainer = make_trainer(["top", "all"], epochs=3, **VARIANTS["sigmoid+dropout"])
        trainer.config.momentum_end, trainer.config.momentum_epochs = 0.9, 2
        return trainer

    uninterrupted = ramped()
    uninterrupted.fit(X_tr, y_tr)
    stopped = ramped()

    def stop_in_phase_two(done, total):
        if stopped.phase_index == 1 and stopped.epoch == 1 and done == 2:
            stopped.stop_requested = True

    stopped.fit(X_tr, y_tr, on_batch=stop_in_phase_two)
    save_finetune_checkpoint(tmp_path / "f.h5", stopped.state())
    resumed = finetune.FinetuneTrainer.from_state(load_finetune_checkpoint(tmp_path / "f.h5"), CPU)
    assert (resumed.config.momentum_end, resumed.config.momentum_epochs) == (0.9, 2)
    resumed.fit(X_tr, y_tr)
    for name, value in uninterrupted.params.items():
        assert resumed.params[name].tobytes() == value.tobytes(), name


def test_config_round_trips_and_old_configs_load_with_defaults(tmp_path):
    import json

    config = finetune.FinetuneConfig(kept=[None, 6], activations=["sigmoid", "ksparse"], input_dropout=0.2,
                                     hidden_dropout=0.5, phases=["softmax", "all"], epochs=3, softmax_lr_start=0.02,
                                     momentum_end=0.9, momentum_epochs=2)
    assert finetune.FinetuneConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    old = {"kept": [75, 75], "phases": ["all"], "epochs": 200, "batch_size": 128, "lr_start": 1.0,
           "lr_end": 0.001, "momentum": 0.25, "sigma": 0.01, "topk": "sort", "seed": 0, "dtype": "float32"}
    loaded = finetune.FinetuneConfig.from_dict(old)
    assert loaded.activations == ["ksparse", "ksparse"]
    assert (loaded.input_dropout, loaded.hidden_dropout, loaded.softmax_lr_start) == (0.0, 0.0, None)
    assert (loaded.momentum_end, loaded.momentum_epochs) == (None, None)
    loaded.validate(hidden=[1000, 1000])


@pytest.mark.parametrize("changes,fragments", [
    (dict(input_dropout=1.0), ["input_dropout 1.0", "0 <= rate < 1"]),  # Python's names: the library's
    (dict(hidden_dropout=-0.5), ["hidden_dropout -0.5", "0 <= rate < 1"]),
    (dict(activations=["tanh"]), ["activation 'tanh' of layer 1", "ksparse, sigmoid, relu"]),
    (dict(activations=["relu"]), ["alpha*k = 4 units kept in relu layer 1", "use None"]),
    (dict(activations=["sigmoid"]), ["alpha*k = 4 units kept in sigmoid layer 1", "use None"]),
    (dict(kept=[None]), ["alpha*k = None units kept in layer 1", "1 <= alpha*k <= 8"]),
    (dict(activations=["ksparse", "sigmoid"]), ["name 2 layers", "has 1"]),
    (dict(softmax_lr_start=0.1), ["softmax_lr_start 0.1 applies to the softmax phase", "phases are all",
                                  "add softmax to phases"]),
    (dict(softmax_lr_start=0.0, phases=["softmax", "all"]), ["softmax_lr_start", "0.0"]),
    (dict(train_on="all"), ["train_on 'all' is not allowed", "train, train+valid"]),
    (dict(momentum_end=1.0), ["momentum_end 1.0", "0 <= momentum < 1"]),
    (dict(momentum_end=0.9, momentum_epochs=0), ["momentum_epochs 0", "epochs"]),
    (dict(momentum_epochs=5), ["momentum_epochs 5", "give momentum_end too"]),
])
def test_bad_network_options_are_one_line_errors(changes, fragments):
    from ksae_cupy.errors import KsaeError

    settings = dict(kept=[4], phases=["all"], epochs=1)
    settings.update(changes)
    with pytest.raises(KsaeError) as info:
        finetune.FinetuneConfig(**settings).validate(hidden=[8])
    assert "\n" not in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))
