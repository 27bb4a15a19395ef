"""Trainer.fit (the epoch loop every caller shares) and the step the trainer resolves once."""
import numpy as np
import pytest

from ksae_cupy.backend import CPU
from ksae_cupy.cpu import numba_kernels as cpu_kernels
from ksae_cupy.cpu import momentum as cpu_momentum
from ksae_cupy.momentum_sgd import MomentumSGD
from ksae_cupy.training import steps as steps_module
from ksae_cupy.training.trainer import TrainConfig, Trainer


def _data(N=150, D=20, seed=3):
    rng = np.random.default_rng(seed)
    return rng.random((N, D), dtype=np.float32), rng.random((40, D), dtype=np.float32)


def _config(**changes):
    # k_start 12 -> k 4 over 4 epochs: with step auto the step changes with k (dense at 12 of 30, sparse at 4)
    values = dict(hidden=30, k=4, k_start=12, epochs=4, batch_size=32, lr=0.05, seed=7)
    values.update(changes)
    return TrainConfig(**values)


def _same_state(a: Trainer, b: Trainer):
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name], err_msg=name)
        np.testing.assert_array_equal(a.optimizer.velocities[name], b.optimizer.velocities[name], err_msg=name)
    assert (a.epoch, a.step, a.batch_in_epoch) == (b.epoch, b.step, b.batch_in_epoch)
    assert a.rng.bit_generator.state == b.rng.bit_generator.state


def _without_times(report):
    return {key: value for key, value in vars(report).items() if key not in ("samples_per_s", "seconds", "parts")}


@pytest.mark.parametrize("changes", [{}, {"step": "dense"}, {"step": "sparse", "aux_k": 5, "dead_window": 40},
                                     {"activation": "relu", "topk": "threshold"}])
def test_fit_trains_the_parameters_of_run_epoch_in_a_loop_bit_for_bit(changes):
    X_nd, X_valid_nd = _data()
    by_hand = Trainer(_config(**changes), CPU, X_nd.shape[1])
    hand_reports = []
    while not by_hand.finished:
        hand_reports.append(by_hand.run_epoch(X_nd, X_valid_nd))
    fitted = Trainer(_config(**changes), CPU, X_nd.shape[1])
    reports = []
    last = fitted.fit(X_nd, X_valid_nd, on_epoch=reports.append)
    _same_state(fitted, by_hand)
    assert [_without_times(r) for r in reports] == [_without_times(r) for r in hand_reports]
    assert last is reports[-1] and last.epoch == 4
    assert fitted.fit(X_nd, X_valid_nd) is None  # finished: no epoch to train


def test_fit_checkpoints_when_due_after_the_epochs_report():
    X_nd, _ = _data()
    trainer = Trainer(_config(epochs=5), CPU, X_nd.shape[1])
    events = []
    trainer.fit(X_nd, on_epoch=lambda r: events.append(("epoch", r.epoch)),
                should_checkpoint=lambda epoch: epoch % 2 == 0, checkpoint=lambda: events.append(("save", trainer.epoch)))
    assert events == [("epoch", 1), ("epoch", 2), ("save", 2), ("epoch", 3), ("epoch", 4), ("save", 4), ("epoch", 5)]


def test_fit_stops_mid_epoch_on_stop_requested_and_resumes_to_the_same_bits():
    X_nd, X_valid_nd = _data()  # 150 rows, batch 32: 5 batches an epoch
    whole = Trainer(_config(), CPU, X_nd.shape[1])
    whole.fit(X_nd, X_valid_nd)

    trainer = Trainer(_config(), CPU, X_nd.shape[1])
    epochs, saves = [], []

    def on_batch(done, total):
        if trainer.epoch == 1 and done == 2:  # in the second epoch, after its second batch
            trainer.stop_requested = True

    last = trainer.fit(X_nd, X_valid_nd, on_epoch=epochs.append, on_batch=on_batch,
                       should_checkpoint=lambda epoch: True, checkpoint=lambda: saves.append(trainer.epoch))
    assert [r.epoch for r in epochs] == [1] and saves == [1] and last is epochs[0]
    assert (trainer.epoch, trainer.batch_in_epoch, trainer.step) == (1, 2, 7)
    trainer.stop_requested = False
    trainer.fit(X_nd, X_valid_nd)
    _same_state(trainer, whole)


def test_a_stop_during_an_epochs_last_batch_ends_after_its_report_and_checkpoint():
    X_nd, _ = _data()
    trainer = Trainer(_config(), CPU, X_nd.shape[1])
    epochs, saves = [], []

    def on_batch(done, total):
        if done == total:
            trainer.stop_requested = True

    trainer.fit(X_nd, on_epoch=epochs.append, on_batch=on_batch, should_checkpoint=lambda epoch: True,
                checkpoint=lambda: saves.append(trainer.epoch))
    assert [r.epoch for r in epochs] == [1] and saves == [1]
    assert (trainer.epoch, trainer.batch_in_epoch) == (1, 0)


def test_the_step_is_resolved_when_built_and_chosen_once_an_epoch_not_per_batch(monkeypatch):
    X_nd, _ = _data()
    trainer = Trainer(_config(), CPU, X_nd.shape[1])
    calls = []
    choose = steps_module.choose_step
    monkeypatch.setattr(steps_module, "choose_step", lambda *a, **kw: calls.append(a) or choose(*a, **kw))
    trainer.fit(X_nd)
    assert len(calls) == 4  # one per epoch (5 batches each), for the k of that epoch
    assert [a[1] for a in calls] == [12, 8, 4, 4]


def test_the_update_is_the_kernels_where_they_run_and_the_optimizers_elsewhere(monkeypatch):
    X_nd, _ = _data()
    trainer = Trainer(_config(step="auto"), CPU, X_nd.shape[1])
    if cpu_kernels.enabled():
        # dense at k 12 of 30 (k / H above 0.25); sparse at 4, W stored in rows: its gradient comes in parts
        assert trainer.update_for(12) is cpu_momentum.fused_step
        assert trainer.update_for(4) is cpu_momentum.rows_step
    monkeypatch.setenv("KSAE_CPU_KERNELS", "0")
    plain = Trainer(_config(step="sparse"), CPU, X_nd.shape[1])
    assert plain.update_for(4) is MomentumSGD.step and plain.update_for(12) is MomentumSGD.step


def test_train_batch_is_one_step_of_the_epoch_loop_and_counts_nothing():
    X_nd, _ = _data(N=32)  # one batch: an epoch is that one step
    config = _config(k_start=None, epochs=1, step="sparse")
    by_epoch = Trainer(config, CPU, X_nd.shape[1])
    rng = np.random.default_rng()
    rng.bit_generator.state = by_epoch.rng.bit_generator.state
    order = rng.permutation(32)  # the epoch's order, as run_epoch will draw it
    report = by_epoch.run_epoch(X_nd)
    probe = Trainer(_config(k_start=None, epochs=1, step="sparse"), CPU, X_nd.shape[1])
    loss = probe.train_batch(X_nd[order])
    assert loss == report.train_loss
    for name in probe.params:
        np.testing.assert_array_equal(probe.params[name], by_epoch.params[name], err_msg=name)
    assert (probe.epoch, probe.step) == (0, 0)
    before = {name: value.copy() for name, value in probe.params.items()}
    probe.train_batch(X_nd, lr=0.0)  # the update at rate 0 moves the weights by momentum alone
    assert not np.array_equal(probe.params["W_dh"], before["W_dh"])
