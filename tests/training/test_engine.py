"""The epoch engine (ksae_cupy.training.epochs): it owns the epoch for every trainer; interleaved epochs are
its same three calls; the step sits a few frames below it; each set's spread is computed once."""
import sys

import numpy as np

from ksae_cupy import metrics
from ksae_cupy.backend import CPU
from ksae_cupy.training import epochs
from ksae_cupy.training.trainer import TrainConfig, Trainer


def _data(N=150, D=20, seed=3):
    rng = np.random.default_rng(seed)
    return rng.random((N, D), dtype=np.float32), rng.random((40, D), dtype=np.float32)


def _trainer(**changes):
    values = dict(hidden=30, k=4, k_start=12, epochs=3, batch_size=32, lr=0.05, seed=7)
    values.update(changes)
    return Trainer(TrainConfig(**values), CPU, D=20)


def test_two_epochs_interleaved_by_the_three_calls_train_as_each_alone():
    X_nd, X_valid_nd = _data()
    alone = [_trainer(seed=seed) for seed in (1, 2)]
    for trainer in alone:
        trainer.fit(X_nd, X_valid_nd)
    together = [_trainer(seed=seed) for seed in (1, 2)]
    reports = {0: [], 1: []}
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        while not all(t.finished for t in together):
            opened = [epochs.open_epoch(t, (X_nd, X_valid_nd)) for t in together]
            while any(t.batch_in_epoch < e.n_batches for t, e in zip(together, opened)):
                for t, e in zip(together, opened):
                    if t.batch_in_epoch < e.n_batches:
                        epochs.step(t, e)
            for i, (t, e) in enumerate(zip(together, opened)):
                reports[i].append(epochs.close_epoch(t, e).train_loss)
    for a, b in zip(alone, together):
        for name in a.params:
            np.testing.assert_array_equal(a.params[name], b.params[name])
    assert len(reports[0]) == 3 and all(np.isfinite(reports[0]))


def test_one_step_is_at_most_six_frames_below_fit():
    """Trainer.fit -> epochs.run_epochs -> epochs.step -> take_step -> _batch_gradients -> Step.gradients -> the
    step's math: no loop, lambda or closure between the engine and the math."""
    X_nd, X_valid_nd = _data()
    trainer = _trainer(step="sparse", epochs=1)
    depths = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name in ("loss_and_grads_sparse", "loss_and_grads") and not depths:
            depth, f = 0, frame.f_back
            while f is not None and f.f_code.co_name != "fit":
                depth, f = depth + 1, f.f_back
            depths.append(depth)

    sys.setprofile(profile)
    try:
        trainer.fit(X_nd, X_valid_nd)
    finally:
        sys.setprofile(None)
    assert depths and depths[0] <= 5, depths  # frames strictly between fit and the math


def test_each_sets_spread_is_computed_once_however_the_epochs_are_run(monkeypatch):
    """The FVE's denominators (a pass over a set's rows) once per set, not once per run_epoch."""
    computed = []
    real = metrics.total_variance
    monkeypatch.setattr(epochs, "total_variance", lambda X_nd: computed.append(X_nd.shape[0]) or real(X_nd))
    X_nd, X_valid_nd = _data()
    trainer = _trainer()
    reports = [trainer.run_epoch(X_nd, X_valid_nd) for _ in range(3)]
    assert computed == [150, 40]
    fresh = _trainer()
    fitted = []
    fresh.fit(X_nd, X_valid_nd, on_epoch=fitted.append)
    assert [r.fve for r in reports] == [r.fve for r in fitted]  # the same figures as fit's
    assert [r.valid_fve for r in reports] == [r.valid_fve for r in fitted]


def test_one_step_is_at_most_fourteen_frames_below_the_command_line(tmp_path):
    """From click's ``main`` down to the step's math, inclusive, as ``ksae-train`` runs a CPU step."""
    from click.testing import CliRunner

    from ksae_cupy.cli.train import train_command

    chains = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name in ("loss_and_grads_sparse", "loss_and_grads") and not chains:
            chain, f = [], frame
            while f is not None and not (f.f_code.co_name == "main" and "click" in f.f_code.co_filename):
                chain.append(f.f_code.co_name)
                f = f.f_back
            chains.append(chain)

    sys.setprofile(profile)
    try:
        result = CliRunner().invoke(train_command, ["synthetic", "--epochs", "1", "--hidden", "64", "--k", "8",
                                                    "--threads", "1", "--device", "cpu", "--quiet",
                                                    "--run-dir", str(tmp_path / "run")])
    finally:
        sys.setprofile(None)
    assert result.exit_code == 0, result.output
    assert chains and len(chains[0]) <= 14, chains  # frames below click's main, the math's own included
