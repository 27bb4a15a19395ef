"""The Python API as a user meets it: imports from ``ksae_cupy``, errors that name parameters
(not flags), integer input, ``score``'s sign, ``load`` of a ksae-train run, and a divergence
that says what was saved and which rate trains the data; ``lr="auto"`` and its statistics."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import ksae_cupy
from clicheck import assert_one_line_error
from ksae_cupy import KSparseAutoencoder, KsaeError, load, load_dataset
from ksae_cupy.training.learning_rate import (MNIST_MEAN_SQUARED_NORM, MNIST_TOP_EIGENVALUE, auto_learning_rate,
                                              mean_squared_norm, top_eigenvalue)
from ksae_cupy.training.trainer import TrainingDiverged


def unit_scale(n=240, D=16, seed=0):
    return np.random.default_rng(seed).random((n, D)).astype(np.float32)


def large_scale(n=400, D=64, seed=0):
    """Values in [0, 10): E||x||^2 ~ 2100, where the paper's 0.01 diverges within a few steps."""
    return (10 * np.random.default_rng(seed).random((n, D))).astype(np.float32)


def small(**overrides):
    return KSparseAutoencoder(**{**dict(n_hidden=32, k=4, k_start=None, epochs=3, batch_size=32, device="cpu"),
                                 **overrides})


def test_the_api_is_importable_from_the_package():
    assert ksae_cupy.KSparseAutoencoder is KSparseAutoencoder and callable(load) and callable(load_dataset)
    assert set(ksae_cupy.__all__) >= {"KSparseAutoencoder", "load", "load_dataset"}
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        ksae_cupy.nothing  # noqa: B018


@pytest.mark.parametrize("params, message", [
    (dict(n_hidden=10, k=25), r"^k 25 is not allowed; use 1 <= k <= n_hidden \(10\)$"),
    (dict(k_start=2), r"^k_start 2 is not allowed; use k_start >= k \(4\)$"),
    # A value of the wrong type or range: scikit-learn's words (the parameter constraints)
    (dict(lr=-1.0), r"^The 'lr' parameter of KSparseAutoencoder must be a float in the range \(0(\.0)?, inf\) or a "
                    r"str among \{'auto'\}\. Got -1\.0 instead\.$"),
    (dict(lr="fast"), r"^The 'lr' parameter .* Got 'fast' instead\.$"),
    (dict(momentum=1.5), r"^The 'momentum' parameter of KSparseAutoencoder must be a float in the range "
                         r"\[0(\.0)?, 1(\.0)?\)\. Got 1\.5 instead\.$"),
    (dict(step="fast"), r"^The 'step' parameter of KSparseAutoencoder must be a str among .*'sparse'.*\. Got 'fast' "
                        r"instead\.$"),
])
def test_errors_name_the_parameter_not_a_flag(params, message):
    with pytest.raises(KsaeError, match=message):
        small(**params).fit(unit_scale())


def test_integer_input_is_converted_to_float_and_its_scale_checked():
    """As scikit-learn does, numeric integers become floats; 8-bit pixels as they are would then
    diverge at the paper's fixed rate, which fit says up front, naming the data's scale (not the
    rate); the default rate, lr="auto", derives a rate they train at."""
    pixels = (unit_scale() * 255).astype(np.uint8)
    with pytest.raises(KsaeError, match=r"^lr 0.01 is above the rate at which momentum SGD can train this data: X's "
                                        r"mean squared norm is .* over 16 features.*lr='auto'.*divide by 255, or "
                                        r"input_scale=1/255"):
        small(lr=0.01).fit(pixels)
    assert np.isfinite(small().fit(pixels).components_).all()
    binary = (unit_scale() > 0.5).astype(np.int64)  # integers on a unit scale train as their floats do
    np.testing.assert_array_equal(small().fit(binary).components_, small().fit(binary.astype(np.float64)).components_)
    scaled = small(input_scale=1 / 255).fit(pixels)
    by_hand = small().fit(pixels.astype(np.float32) / np.float32(255))
    np.testing.assert_allclose(scaled.components_, by_hand.components_, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(scaled.transform(pixels), by_hand.transform(pixels / np.float32(255)), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(KsaeError, match=r"The 'input_scale' parameter .* Got -1 instead"):
        small(input_scale=-1).fit(pixels)


def test_score_is_the_fraction_of_variance_explained():
    """score: 1 - sum ||x - xhat||^2 / sum ||x - mean(x)||^2 (higher is better), xhat from the k largest units."""
    X = unit_scale()
    model = small(epochs=20).fit(X)
    Xhat = model.inverse_transform(model.transform(X, alpha=1))
    X64 = X.astype(np.float64)
    expected = 1 - ((X64 - Xhat) ** 2).sum() / ((X64 - X64.mean(axis=0)) ** 2).sum()
    assert 0 < expected < 1
    assert model.score(X) == pytest.approx(expected, rel=1e-4)
    assert small(n_hidden=48, k=47, epochs=20).fit(X).score(X) > model.score(X)  # more kept units: better
    assert small(epochs=3, lr=0.01).fit(X).score(X) < 0  # 3 epochs at the paper's rate: worse than the mean, and score says so


def test_transform_computes_in_the_dtype_asked_for():
    """A float32 model's features computed in float64 (what write_codes asks for, so that a codes file written
    again with other BLAS threads holds the same bytes): W^T x + b and the alpha*k largest in float64, then
    rounded once to the input's float32."""
    from ksae_cupy import model as ksae_model

    X = unit_scale(D=64)
    fitted = small(n_hidden=48, k=4, alpha=2.0).fit(X)
    params64 = {name: np.asarray(value, dtype=np.float64) for name, value in fitted.params_.items()}
    expected = ksae_model.encode(params64, X.astype(np.float64), 4, 2.0).astype(np.float32)
    in_float64 = fitted.transform(X, dtype=np.float64)
    assert in_float64.dtype == np.float32 and np.array_equal(in_float64, expected)
    assert not np.array_equal(fitted.transform(X), expected)  # float32 sums round otherwise: the option matters
    assert np.array_equal(fitted.transform(X, dtype=np.float32), fitted.transform(X))


def test_load_opens_a_ksae_train_checkpoint(tmp_path):
    from ksae_cupy.cli.train import train_command

    X = unit_scale(300)
    np.save(tmp_path / "x.npy", X)
    run = tmp_path / "run"
    args = [str(tmp_path / "x.npy"), "--hidden", "32", "--k", "4", "--epochs", "3", "--batch-size", "32",
            "--device", "cpu", "--run-dir", str(run), "--quiet"]
    assert CliRunner().invoke(train_command, args, catch_exceptions=False).exit_code == 0
    model = load(run / "checkpoint.h5", device="cpu")
    config = json.loads((run / "config.json").read_text())["train"]
    assert (model.n_hidden, model.k, model.lr, model.n_features_in_) == (32, 4, config["lr"], 16)
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    X_valid = load_dataset(str(tmp_path / "x.npy")).X_valid  # the run's own validation rows
    X64 = X_valid.astype(np.float64)
    variance = ((X64 - X64.mean(axis=0)) ** 2).sum()  # score is the FVE: the loss is (1 - FVE) variance / (2 N)
    assert (1 - model.score(X_valid)) * variance / (2 * len(X_valid)) == pytest.approx(last["valid_loss"], rel=1e-5)
    assert model.transform(X).shape == (300, 32)


# -- divergence and lr="auto" ----------------------------------------------------------------------

def test_divergence_in_python_names_lr_and_the_rate_that_trains():
    X = large_scale()
    with pytest.raises(TrainingDiverged) as info:
        small(lr=0.01).fit(X)
    text = str(info.value)
    assert text.startswith("the loss became") and "with lr 0.01" in text and "--" not in text
    assert "no checkpoint was asked for" in text and f"lr auto gives {auto_learning_rate(X)} for this data" in text


def test_divergence_says_nothing_was_saved_when_no_checkpoint_was_written(tmp_path):
    with pytest.raises(TrainingDiverged, match="nothing was saved"):
        small(lr=0.01).fit(large_scale(), checkpoint_path=tmp_path / "c.h5", should_checkpoint=lambda epoch: True)
    assert not (tmp_path / "c.h5").exists()


def test_lr_auto_trains_where_the_paper_rate_diverges():
    X = large_scale()
    reports = []
    model = small(lr="auto", epochs=4).fit(X, on_epoch=reports.append)
    assert model.trainer_.config.lr == auto_learning_rate(X) and model.trainer_.config.lr_auto
    assert model.lr == "auto"  # the parameter stays as given (scikit-learn's rule)
    losses = [r.train_loss for r in reports]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_ksae_train_divergence_names_the_flag_what_was_saved_and_the_auto_rate(tmp_path):
    from ksae_cupy.cli.train import train_command

    np.save(tmp_path / "big.npy", large_scale())
    common = ["--hidden", "32", "--k", "4", "--no-k-schedule", "--epochs", "3", "--batch-size", "32", "--device", "cpu"]
    result = CliRunner().invoke(train_command, [str(tmp_path / "big.npy"), *common, "--lr", "0.01",
                                                "--run-dir", str(tmp_path / "r1")])
    assert_one_line_error(result, "with --lr 0.01", "nothing was saved", "--lr auto gives", status=1)
    ok = CliRunner().invoke(train_command, [str(tmp_path / "big.npy"), *common, "--run-dir", str(tmp_path / "r2")],
                            catch_exceptions=False)
    assert ok.exit_code == 0, ok.output
    train_rows = load_dataset(str(tmp_path / "big.npy")).X_train  # the rows the rate is derived from
    assert f"--lr auto: {auto_learning_rate(train_rows)} for this data" in ok.output
    assert '"lr_auto": true' in ok.output


def test_lr_auto_statistics():
    rng = np.random.default_rng(1)
    X = rng.random((500, 20)).astype(np.float32)
    assert mean_squared_norm(X) == pytest.approx(float((X.astype(np.float64) ** 2).sum(1).mean()), rel=1e-9)
    second_moment = X.T.astype(np.float64) @ X / len(X)
    assert top_eigenvalue(X) == pytest.approx(np.linalg.eigvalsh(second_moment)[-1], rel=1e-6)
    # twice the scale, a quarter of the rate (up to the rounding to two digits)
    assert auto_learning_rate(2 * X) == pytest.approx(auto_learning_rate(X) / 4, rel=0.05)
    # all-zero data has no scale to go by: the paper's rate
    assert auto_learning_rate(np.zeros((4, 3), np.float32)) == 0.01


def test_lr_auto_is_the_papers_rate_on_mnist():
    from ksae_cupy.datasets import data_root
    from ksae_cupy.datasets.fetch import verify_file
    from ksae_cupy.datasets.mnist import FILES

    folder = data_root() / "mnist"
    if any(verify_file(folder, spec)[0] != "ok" for spec in FILES):
        pytest.skip(f"MNIST is not in {folder} (set KSAE_DATA_DIR, or `ksae-data fetch mnist`)")
    X_train = load_dataset("mnist", log=lambda m: None).X_train
    assert mean_squared_norm(X_train) == pytest.approx(MNIST_MEAN_SQUARED_NORM, abs=1e-3)
    assert top_eigenvalue(X_train) == pytest.approx(MNIST_TOP_EIGENVALUE, abs=1e-2)
    assert auto_learning_rate(X_train) == 0.01


def test_prepare_checks_before_fit_and_fit_trains_the_prepared_trainer():
    X = unit_scale()
    model = small(lr="auto").prepare(X)
    prepared = model.trainer_
    assert prepared.step == 0 and prepared.config.lr == auto_learning_rate(X) and prepared.config.lr_auto
    model.fit(X)
    assert model.trainer_ is prepared and prepared.epoch == 3  # trained, not built again
    trained = small(lr="auto").fit(X)  # the same as a fit without prepare
    np.testing.assert_array_equal(model.components_, trained.components_)
    again = small(lr="auto").prepare(X)
    unused = again.trainer_
    again.fit(X.copy())  # other rows (an equal copy): a trainer of their own
    assert again.trainer_ is not unused and again.trainer_.epoch == 3 and unused.step == 0
    with pytest.raises(KsaeError, match="lr 1e-20 is not allowed for this data"):  # the checks fit makes, made now
        small(lr=1e-20).prepare(X)
