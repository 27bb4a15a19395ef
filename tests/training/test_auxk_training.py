"""Training with the options beyond the paper (issue 35): AuxK's dead-unit state, resume, metrics; centred inputs."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy import model
from ksae_cupy.backend import CPU
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.preprocess import raw_input_params
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.checkpoint import load_checkpoint
from ksae_cupy.training.estimator import KSparseAutoencoder
from ksae_cupy.training.trainer import TrainConfig, Trainer
from resumecheck import params_of, stop_at

X_nd, _, _ = make_sparse_signals(600, D=16, H=32, k=3, seed=1)
SETTINGS = dict(n_hidden=40, k=3, k_start=12, epochs=4, batch_size=50, device="cpu", seed=7, aux_k=6, aux_coef=0.5,
                dead_window=100)


def test_auxk_stopped_mid_epoch_then_resumed_equals_uninterrupted(tmp_path, cpu_path):
    reports = []
    uninterrupted = KSparseAutoencoder(**SETTINGS).fit(X_nd, on_epoch=reports.append)
    assert all(r.aux_loss > 0 for r in reports[1:])  # units were dead, and the loss trained them
    stopped = KSparseAutoencoder(**SETTINGS)
    stopped.fit(X_nd, on_batch=stop_at(stopped, epoch=2, batch=5), checkpoint_path=tmp_path / "c.h5")
    assert (stopped.trainer_.epoch, stopped.trainer_.batch_in_epoch) == (2, 5)
    saved = load_checkpoint(tmp_path / "c.h5").units["since_kept_h"]
    np.testing.assert_array_equal(saved, stopped.trainer_.since_kept_h)
    assert saved.max() >= SETTINGS["dead_window"]  # the state is not trivial: some units were dead
    resumed = KSparseAutoencoder.load(tmp_path / "c.h5", device="cpu")
    assert (resumed.aux_k, resumed.aux_coef, resumed.dead_window) == (6, 0.5, 100)
    resumed.fit(X_nd)
    for name, value in params_of(uninterrupted).items():
        np.testing.assert_array_equal(params_of(resumed)[name], value)
    np.testing.assert_array_equal(resumed.trainer_.since_kept_h, uninterrupted.trainer_.since_kept_h)


def test_dead_units_get_gradient_only_with_auxk():
    """One step from a state where half the units are dead: with aux_k, dead units outside the
    batch's top k move; without, none of them does (their momentum is zero at the start)."""
    moved, X_batch = {}, X_nd[:8]  # one batch of 8 examples: 24 kept slots, so some units stay unkept
    for aux_k in (0, 8):
        config = TrainConfig(hidden=40, k=3, k_start=None, epochs=1, batch_size=8, aux_k=aux_k, dead_window=50)
        trainer = Trainer(config, CPU, D=16)
        trainer.since_kept_h[::2] = 50  # every other unit dead
        W_before = trainer.params["W_dh"].copy()
        trainer.run_epoch(X_batch)
        kept = np.zeros(40, dtype=bool)
        kept[np.unique(model.select_units(model.hidden_preactivations(
            {n: np.asarray(v) for n, v in Trainer(config, CPU, D=16).params.items()}, X_batch), 3)[0])] = True
        dead_not_kept = np.zeros(40, dtype=bool)
        dead_not_kept[::2] = True
        dead_not_kept &= ~kept
        assert dead_not_kept.any()
        moved[aux_k] = (trainer.params["W_dh"] != W_before).any(axis=0)[dead_not_kept]
    assert not moved[0].any() and moved[8].all()


def test_dead_window_counts_examples_since_each_unit_was_kept():
    config = TrainConfig(hidden=40, k=3, k_start=None, epochs=2, batch_size=100, dead_window=250)
    trainer = Trainer(config, CPU, D=16)
    report = trainer.run_epoch(X_nd)
    since = trainer.since_kept_h
    assert since.min() == 0 and since.max() <= 600 and set(np.unique(since)) <= set(range(0, 601, 100))
    assert report.dead_window_fraction == pytest.approx(np.mean(since >= 250))
    assert report.aux_loss is None  # off: the paper's step
    never_kept = report.dead_fraction  # kept in no example of the epoch: 600 examples >= 250
    assert report.dead_window_fraction >= never_kept


def test_auxk_off_is_the_papers_step_bit_for_bit():
    plain = KSparseAutoencoder(n_hidden=40, k=3, k_start=12, epochs=3, batch_size=50, device="cpu", seed=7).fit(X_nd)
    off = KSparseAutoencoder(n_hidden=40, k=3, k_start=12, epochs=3, batch_size=50, device="cpu", seed=7, aux_k=0,
                             aux_coef=0.5, dead_window=10).fit(X_nd)
    for name, value in params_of(plain).items():
        np.testing.assert_array_equal(params_of(off)[name], value)


@pytest.mark.parametrize("values, message", [
    (dict(aux_k=-1), "--aux-k -1 is not allowed; use 0 (off) to hidden (40)"),
    (dict(aux_k=41), "--aux-k 41 is not allowed"),
    (dict(aux_k=4, aux_coef=0.0), "--aux-coef 0.0 is not allowed; use a positive weight"),
    (dict(dead_window=0), "--dead-window 0 is not allowed; use a positive number of examples"),
])
def test_bad_values_are_one_line(values, message):
    """In Python the field's name (aux_k); on the command line its flag (--aux-k)."""
    from ksae_cupy.errors import OptionError, cli_name

    with pytest.raises(OptionError) as caught:
        TrainConfig(hidden=40, k=3, k_start=None, **values).validate()
    field = next(iter(values)) if "aux_coef" not in values else "aux_coef"
    assert str(caught.value).startswith(message.replace("--" + cli_name(field)[2:], field)), str(caught.value)
    assert caught.value.spelled(cli_name(caught.value.field), cli_name).startswith(message)


def test_center_input_keeps_the_mean_and_uses_it_everywhere(tmp_path):
    X = X_nd + 3.0  # far from centred
    fitted = KSparseAutoencoder(n_hidden=40, k=3, k_start=None, epochs=2, batch_size=50, device="cpu",
                                center_input=True).fit(X)
    mean_d = fitted.preprocess_["input_mean"]
    np.testing.assert_allclose(mean_d, X.mean(axis=0), rtol=1e-6)
    params = {n: np.asarray(v) for n, v in fitted.params_.items()}
    expected = model.encode(params, (X - mean_d).astype(np.float32), 3)
    np.testing.assert_array_equal(fitted.transform(X, alpha=1), expected)
    # ksae-eval and fine-tuning take the parameters on raw inputs: the same codes, the mean in b.
    raw = raw_input_params(params, fitted.preprocess_)
    np.testing.assert_allclose(model.encode(raw, X, 3), expected, rtol=1e-4, atol=1e-5)
    Xhat = fitted.inverse_transform(expected)
    np.testing.assert_allclose(Xhat, model.decode(params, expected) + mean_d, rtol=1e-5, atol=1e-5)
    # The mean travels in the checkpoint.
    fitted.save(tmp_path / "c.h5")
    loaded = KSparseAutoencoder.load(tmp_path / "c.h5", device="cpu")
    assert loaded.center_input
    np.testing.assert_array_equal(loaded.transform(X, alpha=1), expected)
    # Without the option nothing is subtracted and no mean is kept.
    plain = KSparseAutoencoder(n_hidden=40, k=3, k_start=None, epochs=1, batch_size=50, device="cpu").fit(X)
    assert "input_mean" not in plain.preprocess_


def test_cli_records_the_options_and_resume_refuses_other_values(tmp_path):
    data = tmp_path / "d.npy"
    np.save(data, X_nd)
    run_dir = tmp_path / "run"
    args = [str(data), "--hidden", "40", "--k", "3", "--epochs", "2", "--batch-size", "50", "--aux-k", "5",
            "--dead-window", "100", "--center-input", "--run-dir", str(run_dir), "--quiet", "--lr", "0.01"]
    result = CliRunner().invoke(train_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    train = json.loads((run_dir / "config.json").read_text())["train"]
    assert (train["aux_k"], train["aux_coef"], train["dead_window"], train["center_input"]) == (5, 1 / 32, 100, True)
    ckpt = load_checkpoint(run_dir / "checkpoint.h5")
    assert ckpt.preprocess["input_mean"].shape == (16,) and ckpt.units["since_kept_h"].shape == (40,)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m["aux_loss"] >= 0 and 0 <= m["dead_window_fraction"] <= 1 for m in metrics)
    assert metrics[-1]["aux_loss"] > 0 and metrics[-1]["dead_window_fraction"] > 0
    refused = CliRunner().invoke(train_command, ["--resume", str(run_dir), "--aux-k", "6", "--epochs", "3"])
    assert refused.exit_code != 0
    assert "--aux-k 6 (the run has 5)" in refused.output and "Traceback" not in refused.output


def test_ksae_eval_encodes_a_centred_run_as_its_estimator_does(tmp_path, monkeypatch):
    from ksae_cupy.evaluation import run_evaluation, selection

    data = tmp_path / "d.npz"
    y = np.arange(len(X_nd)) % 3
    np.savez(data, X=X_nd + 2.0, y=y)
    run_dir = tmp_path / "run"
    args = [str(data), "--hidden", "40", "--k", "3", "--no-k-schedule", "--epochs", "1", "--batch-size", "50",
            "--center-input", "--run-dir", str(run_dir), "--quiet", "--lr", "0.01"]
    result = CliRunner().invoke(train_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    seen = {}

    class Seen(Exception):
        pass

    def capture(encode, dataset, *args, **kwargs):  # ksae-eval's features, then stop before any classifier
        seen["codes"], seen["X"] = encode(1.0, dataset.X_train[:20]), dataset.X_train[:20]
        raise Seen

    monkeypatch.setattr(selection, "select_and_test", capture)
    with pytest.raises(Seen):
        run_evaluation.evaluate_run(run_dir, alphas=[1.0])
    estimator = KSparseAutoencoder.load(run_dir / "checkpoint.h5", device="cpu")
    codes = seen["codes"].toarray() if hasattr(seen["codes"], "toarray") else np.asarray(seen["codes"])
    np.testing.assert_allclose(codes, estimator.transform(seen["X"], alpha=1), rtol=1e-4, atol=1e-5)
    assert np.abs(codes).sum() > 0


def test_a_centred_runs_parameters_act_on_raw_rows_in_analyze_plot_and_finetune(tmp_path):
    from ksae_cupy.evaluation.trained_run import open_run
    from ksae_cupy.supervised.pretrain import encoder_of

    data = tmp_path / "d.npy"
    np.save(data, X_nd + 2.0)
    run_dir = tmp_path / "run"
    args = [str(data), "--hidden", "40", "--k", "3", "--no-k-schedule", "--epochs", "1", "--batch-size", "50",
            "--center-input", "--run-dir", str(run_dir), "--quiet", "--lr", "0.01"]
    assert CliRunner().invoke(train_command, args, catch_exceptions=False).exit_code == 0
    estimator = KSparseAutoencoder.load(run_dir / "checkpoint.h5", device="cpu")
    X = (X_nd[:30] + 2.0).astype(np.float32)
    expected = estimator.transform(X, alpha=1)
    # ksae-analyze and ksae-plot read Run.params; ksae-finetune starts from encoder_of.
    np.testing.assert_allclose(model.encode(open_run(run_dir).params, X, 3), expected, rtol=1e-4, atol=1e-5)
    W_dh, b_h = encoder_of(estimator)
    np.testing.assert_allclose(model.encode({"W_dh": W_dh, "b_h": b_h}, X, 3), expected, rtol=1e-4, atol=1e-5)
